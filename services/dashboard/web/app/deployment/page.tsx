"use client";
// One deployment: its versions, stats charts (calls/min, p50/p99 and queue depth over time, cold starts by kind),
// its checkpoints and its containers, and a stop button. All of it follows the live events.
import { Suspense } from "react";
import { ActionButton } from "@/components/ActionButton";
import { ColdStartChart } from "@/components/ColdStartChart";
import { StartTimes } from "@/components/StartTimes";
import { LineChart } from "@/components/LineChart";
import { ContainerLink } from "@/components/Links";
import { ErrorNote, Loading, NotFound, Section, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { seg } from "@/lib/api";
import { byName } from "@/lib/deployments";
import { ago, bytes, ms, shortId, timeOf } from "@/lib/format";
import { toStats, type RawStats } from "@/lib/stats";
import type { Checkpoint, Container, Deployment } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";
import { useQueryParam } from "@/lib/useQueryParam";

function DeploymentView() {
  const name = useQueryParam("name");
  const { data, error } = useResource<Deployment[]>("/api/v1/deployments", {}, about(["deployment"]));
  if (error) return <ErrorNote error={error} />;
  if (!data) return <Loading what="the deployment" />;
  const found = byName(data).find((d) => d.latest.name === name);
  if (!found) return <NotFound what={`Deployment ${JSON.stringify(name)}`} />;
  const ids = new Set(found.versions.map((v) => v.deployment_id));
  const { latest } = found;
  return (
    <>
      <header className="page-head">
        <h1>{latest.name}</h1>
        <StatusPill status={latest.status} />
        <span className="quiet">v{latest.version}</span>
        {latest.status === "active" && (
          <ActionButton label="stop deployment" danger path={`/api/deployments/${seg(latest.name)}/stop`}
            confirm={`Stop ${latest.name}? Its containers stop.`} />
        )}
      </header>
      <Stats name={latest.name} />
      <div className="grid-2">
        <Versions versions={found.versions} />
        <Checkpoints ids={ids} />
      </div>
      <Containers name={latest.name} ids={ids} />
    </>
  );
}

function Stats({ name }: { name: string }) {
  const { data, error } = useResource<RawStats>(`/api/v1/deployments/${seg(name)}/stats`, { minutes: 60 },
    about(["call", "container"]));
  const stats = data ? toStats(data) : null;
  return (
    <Section title="Last hour">
      <ErrorNote error={error} />
      {!stats && !error && <Loading what="stats" />}
      {stats && (
        <>
          <div className="charts">
            <LineChart title="calls per minute" series={stats.calls} unit="" />
            <LineChart title="latency p50 / p99" series={stats.latency} unit=" ms" />
            <LineChart title="queue depth (most calls waiting at once)" series={stats.queue} unit="" />
            <ColdStartChart kinds={stats.kinds} />
            <StartTimes starts={stats.starts} />
          </div>
          {stats.notes.length > 0 && <ul className="notes">{stats.notes.map((n) => <li key={n}>{n}</li>)}</ul>}
        </>
      )}
    </Section>
  );
}

function Versions({ versions }: { versions: Deployment[] }) {
  return (
    <Section title="Versions">
      <Table label="versions" rows={[...versions].sort((a, b) => b.version - a.version)} rowKey={(v) => v.deployment_id}
        columns={[
          { title: "version", cell: (v) => `v${v.version}` },
          { title: "status", cell: (v) => <StatusPill status={v.status} /> },
          { title: "id", cell: (v) => <span className="mono" title={v.deployment_id}>{shortId(v.deployment_id)}</span> },
          { title: "deployed", cell: (v) => <span title={timeOf(v.created_at)}>{ago(v.created_at)}</span> },
        ]} />
    </Section>
  );
}

function Checkpoints({ ids }: { ids: Set<string> }) {
  const { data, error } = useResource<Checkpoint[]>("/api/v1/checkpoints", {}, about(["checkpoint"]));
  const rows = (data ?? []).filter((c) => ids.has(c.deployment_id));
  return (
    <Section title="Checkpoints">
      <ErrorNote error={error} />
      <Table label="checkpoints" rows={rows} rowKey={(c) => c.checkpoint_id} empty="no checkpoint yet"
        columns={[
          { title: "checkpoint", cell: (c) => <span className="mono" title={c.checkpoint_id}>{shortId(c.checkpoint_id)}</span> },
          { title: "status", cell: (c) => <StatusPill status={c.status} /> },
          { title: "size", cell: (c) => bytes(c.size_bytes), className: "num" },
          { title: "restores", cell: (c) => c.restores, className: "num" },
        ]} />
    </Section>
  );
}

function Containers({ name, ids }: { name: string; ids: Set<string> }) {
  const { data, error } = useResource<Container[]>("/api/v1/containers", { all: true, limit: 200, deployment: name },
    about(["container"]));
  const rows = (data ?? []).filter((c) => ids.has(c.deployment_id) || c.deployment_name === name);
  return (
    <Section title="Containers">
      <ErrorNote error={error} />
      <Table label="containers" rows={rows} rowKey={(c) => c.container_id} empty="no containers"
        columns={[
          { title: "container", cell: (c) => <ContainerLink id={c.container_id} /> },
          { title: "status", cell: (c) => <StatusPill status={c.status} /> },
          { title: "started", cell: (c) => (c.restored_from ? "restored" : c.status === "requested" ? "–" : "cold") },
          { title: "ready after", cell: (c) => readyAfter(c) },
          { title: "worker", cell: (c) => <span className="mono">{shortId(c.worker_id, 12)}</span> },
          { title: "updated", cell: (c) => <span title={timeOf(c.updated_at)}>{ago(c.updated_at)}</span> },
        ]} />
    </Section>
  );
}

function readyAfter(c: Container): string {
  if (!c.ready_at || !c.requested_at) return "–";
  return ms(new Date(c.ready_at).getTime() - new Date(c.requested_at).getTime());
}

export default function DeploymentPage() {
  return (
    <Suspense>
      <DeploymentView />
    </Suspense>
  );
}
