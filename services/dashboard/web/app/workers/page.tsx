"use client";
// Workers: pool, state, capacity used, GPUs; cordon (no new containers) or drain (and move them).
import { ActionButton } from "@/components/ActionButton";
import { ErrorNote, Loading, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { seg } from "@/lib/api";
import { ago, cpu, timeOf } from "@/lib/format";
import type { Worker } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

function flags(w: Worker): string {
  return [w.cordoned && "cordoned", w.draining && "draining"].filter(Boolean).join(", ");
}

export default function WorkersPage() {
  const { data, error } = useResource<Worker[]>("/api/v1/workers", {}, about(["worker"]));
  return (
    <>
      <h1>Workers</h1>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="workers" />}
      {data && (
        <Table label="workers" rows={data} rowKey={(w) => w.worker_id} empty="no workers"
          columns={[
            { title: "worker", cell: (w) => <span className="mono">{w.worker_id}</span> },
            { title: "pool", cell: (w) => w.pool },
            { title: "status", cell: (w) => <><StatusPill status={w.status} /> <span className="quiet">{flags(w)}</span></> },
            { title: "cpu", cell: (w) => `${cpu(w.cpu_used)} / ${cpu(w.cpu_millicores)}` },
            { title: "memory", cell: (w) => `${w.memory_used} / ${w.memory_mib} MiB` },
            { title: "GPU", cell: (w) => (w.gpu_count ? `${w.gpu_used}/${w.gpu_count} ${w.gpu_type}` : "–") },
            { title: "features", cell: (w) => (w.features ?? []).join(", ") },
            { title: "seen", cell: (w) => <span title={timeOf(w.updated_at)}>{ago(w.updated_at)}</span> },
            {
              title: "",
              cell: (w) => (
                <span className="action">
                  <ActionButton label="cordon" path={`/api/workers/${seg(w.worker_id)}/cordon`} disabled={w.cordoned}
                    confirm={`Cordon ${w.worker_id}? It takes no new containers.`} />
                  <ActionButton label="drain" danger path={`/api/workers/${seg(w.worker_id)}/drain`} disabled={w.draining}
                    confirm={`Drain ${w.worker_id}? Its containers stop and start elsewhere.`} />
                </span>
              ),
            },
          ]} />
      )}
    </>
  );
}
