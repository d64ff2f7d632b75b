"use client";
// Overview: deployments and their versions, containers by state, workers and pools with free
// capacity and GPU types, the last failures with their reasons. Refreshed by live events.
import { ChainLink, ContainerLink, DeploymentLink } from "@/components/Links";
import { ErrorNote, Loading, Section, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { ago, cpu, timeOf } from "@/lib/format";
import type { Overview, OverviewFailure, OverviewPool, OverviewWorker } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

export default function OverviewPage() {
  const { data, error } = useResource<Overview>("/api/overview", {},
    about(["container", "deployment", "worker", "image", "checkpoint"]));
  return (
    <>
      <h1>Overview</h1>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="the overview" />}
      {data && (
        <>
          <div className="grid-2">
            <ContainerCounts containers={data.containers} />
            <Pools pools={data.pools ?? []} />
          </div>
          <Deployments rows={data.deployments ?? []} />
          <Failures rows={data.failures ?? []} note={data.failures_note} />
          <Workers rows={data.workers ?? []} />
        </>
      )}
    </>
  );
}

function ContainerCounts({ containers }: { containers: Overview["containers"] }) {
  const entries = Object.entries(containers?.by_state ?? {});
  return (
    <Section title="Containers by state">
      <ul className="counts" data-testid="container-counts">
        {entries.length === 0 && <li className="quiet">no live containers</li>}
        {entries.map(([state, n]) => <li key={state}><StatusPill status={state} /> <strong>{n}</strong></li>)}
        {containers && containers.ended > 0 && <li className="quiet">{containers.ended} ended</li>}
      </ul>
    </Section>
  );
}

function Pools({ pools }: { pools: OverviewPool[] }) {
  return (
    <Section title="Pools">
      <Table label="pools" rows={pools} rowKey={(p) => p.pool} empty="no pools"
        columns={[
          { title: "pool", cell: (p) => p.pool || "–" },
          { title: "workers", cell: (p) => `${p.ready} ready of ${p.workers}` },
          { title: "free", cell: (p) => `${cpu(p.free?.cpu_millicores)}, ${p.free?.memory_mib ?? 0} MiB` },
          { title: "GPUs", cell: (p) => (p.gpu_types?.length ? `${p.free?.gpus ?? 0} free: ${p.gpu_types.join(", ")}` : "–") },
        ]} />
    </Section>
  );
}

function Deployments({ rows }: { rows: Overview["deployments"] }) {
  return (
    <Section title="Deployments">
      <Table label="deployments" rows={rows} rowKey={(r) => r.name} empty="nothing deployed"
        columns={[
          { title: "name", cell: (r) => <DeploymentLink name={r.name} /> },
          { title: "status", cell: (r) => <StatusPill status={r.status} /> },
          { title: "version", cell: (r) => `v${r.version}` },
          { title: "versions", cell: (r) => (r.versions ?? []).map((v) => `v${v.version} ${v.status}`).join(", "), className: "wide" },
          { title: "deployed", cell: (r) => <span title={timeOf(r.created_at)}>{ago(r.created_at)}</span> },
        ]} />
    </Section>
  );
}

function Failures({ rows, note }: { rows: OverviewFailure[]; note?: string }) {
  return (
    <Section title="Recent failures">
      {note && <p className="note">{note}</p>}
      <Table label="failures" rows={rows} empty="no failures" rowKey={(f) => String(f.seq)}
        columns={[
          { title: "when", cell: (f) => <span title={timeOf(f.at)}>{ago(f.at)}</span> },
          { title: "what", cell: (f) => f.type },
          { title: "of", cell: (f) => (f.aggregate === "container" ? <ContainerLink id={f.aggregate_id} /> : <span className="mono">{f.aggregate} {f.aggregate_id}</span>) },
          { title: "reason", cell: (f) => <span className="reason">{f.reason}</span>, className: "wide" },
          { title: "chain", cell: (f) => <ChainLink id={f.correlation_id} /> },
        ]} />
    </Section>
  );
}

function Workers({ rows }: { rows: OverviewWorker[] }) {
  return (
    <Section title="Workers">
      <Table label="workers" rows={rows} rowKey={(w) => w.worker_id} empty="no workers"
        columns={[
          { title: "worker", cell: (w) => <span className="mono">{w.worker_id}</span> },
          { title: "pool", cell: (w) => w.pool },
          { title: "status", cell: (w) => <><StatusPill status={w.status} /> {w.cordoned && <span className="quiet">cordoned</span>} {w.draining && <span className="quiet">draining</span>}</> },
          { title: "free", cell: (w) => `${cpu(w.free?.cpu_millicores)}, ${w.free?.memory_mib ?? 0} MiB` },
          { title: "GPU", cell: (w) => (w.gpu_count ? `${w.free?.gpus ?? 0}/${w.gpu_count} ${w.gpu_type}` : "–") },
        ]} />
    </Section>
  );
}
