"use client";
// Images: each blueprint's build, its state and size; a build's page shows its steps live.
import { ImageLink } from "@/components/Links";
import { ErrorNote, Loading, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { ago, bytes, timeOf } from "@/lib/format";
import type { ImageSummary } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

export default function ImagesPage() {
  const { data, error } = useResource<ImageSummary[]>("/api/v1/images", {}, about(["image"]));
  return (
    <>
      <h1>Images</h1>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="images" />}
      {data && (
        <Table label="images" rows={data} rowKey={(i) => i.image_id} empty="no image built yet"
          columns={[
            { title: "image", cell: (i) => <ImageLink id={i.image_id} /> },
            { title: "status", cell: (i) => <StatusPill status={i.status} /> },
            { title: "steps", cell: (i) => i.steps, className: "num" },
            { title: "size", cell: (i) => bytes(i.size_bytes), className: "num" },
            { title: "built", cell: (i) => <span title={timeOf(i.built_at)}>{ago(i.built_at)}</span> },
            { title: "reason", cell: (i) => <span className="reason">{i.reason}</span>, className: "wide" },
          ]} />
      )}
    </>
  );
}
