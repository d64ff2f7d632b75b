"use client";
// Containers, newest change first, one page at a time (the server counts and slices), live.
import { useState } from "react";
import { ContainerLink, DeploymentLink } from "@/components/Links";
import { Pager } from "@/components/Pager";
import { ErrorNote, Loading, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { ago, cpu, shortId, timeOf } from "@/lib/format";
import type { Container } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

const LIMIT = 50;

export default function ContainersPage() {
  const [offset, setOffset] = useState(0);
  const [all, setAll] = useState(false);
  const { data, answer, error } = useResource<Container[]>("/api/v1/containers", { limit: LIMIT, offset, all },
    about(["container"]));
  return (
    <>
      <header className="page-head">
        <h1>Containers</h1>
        <label className="check">
          <input type="checkbox" checked={all} onChange={(e) => { setAll(e.target.checked); setOffset(0); }} />
          stopped and failed too
        </label>
      </header>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="containers" />}
      {data && (
        <>
          <Table label="containers" rows={data} rowKey={(c) => c.container_id} empty="no containers"
            columns={[
              { title: "container", cell: (c) => <ContainerLink id={c.container_id} /> },
              { title: "deployment", cell: (c) => <DeploymentLink name={c.deployment_name} /> },
              { title: "status", cell: (c) => <StatusPill status={c.status} /> },
              { title: "start", cell: (c) => (c.restored_from ? "restored" : c.worker_id ? "cold" : "–") },
              { title: "worker", cell: (c) => <span className="mono">{shortId(c.worker_id, 12)}</span> },
              { title: "size", cell: (c) => `${cpu(c.cpu_millicores)}, ${c.memory_mib} MiB` },
              { title: "reason", cell: (c) => <span className="reason">{c.reason || c.note}</span>, className: "wide" },
              { title: "updated", cell: (c) => <span title={timeOf(c.updated_at)}>{ago(c.updated_at)}</span> },
            ]} />
          <Pager offset={offset} limit={LIMIT} total={answer?.total ?? null} shown={data.length} onOffset={setOffset} />
        </>
      )}
    </>
  );
}
