"use client";
// Checkpoints: size, state, how often each was restored and when last.
import { ContainerLink } from "@/components/Links";
import { ErrorNote, Loading, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { ago, bytes, shortId, timeOf } from "@/lib/format";
import type { Checkpoint } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

export default function CheckpointsPage() {
  const { data, error } = useResource<Checkpoint[]>("/api/v1/checkpoints", {}, about(["checkpoint", "container"]));
  return (
    <>
      <h1>Checkpoints</h1>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="checkpoints" />}
      {data && (
        <Table label="checkpoints" rows={data} rowKey={(c) => c.checkpoint_id} empty="no checkpoints"
          columns={[
            { title: "checkpoint", cell: (c) => <span className="mono" title={c.checkpoint_id}>{shortId(c.checkpoint_id)}</span> },
            { title: "status", cell: (c) => <StatusPill status={c.status} /> },
            { title: "size", cell: (c) => bytes(c.size_bytes), className: "num" },
            { title: "of container", cell: (c) => <ContainerLink id={c.container_id} /> },
            { title: "runtime", cell: (c) => [c.runtime, c.accelerator].filter(Boolean).join(", ") || "–" },
            { title: "restores", cell: (c) => c.restores, className: "num" },
            { title: "last restored", cell: (c) => <span title={timeOf(c.last_restored_at)}>{ago(c.last_restored_at) || "never"}</span> },
            { title: "made", cell: (c) => <span title={timeOf(c.created_at)}>{ago(c.created_at)}</span> },
          ]} />
      )}
    </>
  );
}
