"use client";
// Overview: deployments and their versions, containers by state, workers and pools with free
// capacity and GPU types, the last failures with their reasons. Refreshed by live events.
import { DeploymentLink, ChainLink, ContainerLink } from "@/components/Links";
import { ErrorNote, Loading, Section, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { ago, cpu, timeOf } from "@/lib/format";
import { list, numberOf, pick, textOf } from "@/lib/pick";
import { about, useResource } from "@/lib/useResource";

type Row = Record<string, unknown>;

export default function OverviewPage() {
  const { data, error } = useResource<Row>("/api/overview", {},
    about(["container", "deployment", "worker", "call", "image", "checkpoint"]));
  return (
    <>
      <h1>Overview</h1>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="the overview" />}
      {data && (
        <div className="grid-2">
          <ContainerCounts counts={pick<Record<string, number>>(data, "containers_by_state", "containers") ?? {}} />
          <Pools pools={list(data, "pools")} />
          <Deployments rows={list(data, "deployments")} />
          <Failures rows={list(data, "failures", "recent_failures")} />
          <Workers rows={list(data, "workers")} />
        </div>
      )}
    </>
  );
}

function ContainerCounts({ counts }: { counts: Record<string, number> }) {
  const byState = (pick<Record<string, number>>(counts, "by_state") ?? counts) as Record<string, number>;
  const entries = Object.entries(byState).filter(([, n]) => typeof n === "number");
  return (
    <Section title="Containers by state">
      <ul className="counts" data-testid="container-counts">
        {entries.length === 0 && <li className="quiet">no containers</li>}
        {entries.map(([state, n]) => (
          <li key={state}><StatusPill status={state} /> <strong>{n}</strong></li>
        ))}
      </ul>
    </Section>
  );
}

function Deployments({ rows }: { rows: Row[] }) {
  return (
    <Section title="Deployments">
      <Table label="deployments" rows={rows} rowKey={(r) => textOf(r, "name")} empty="nothing deployed"
        columns={[
          { title: "name", cell: (r) => <DeploymentLink name={textOf(r, "name")} /> },
          { title: "version", cell: (r) => textOf(r, "version", "latest_version") || list(r, "versions").length },
          { title: "status", cell: (r) => <StatusPill status={textOf(r, "status")} /> },
          { title: "containers", cell: (r) => containerSummary(pick(r, "containers")) },
        ]} />
    </Section>
  );
}

function containerSummary(value: unknown): string {
  if (typeof value === "number") return String(value);
  if (value && typeof value === "object") {
    return Object.entries(value as Record<string, number>).map(([s, n]) => `${n} ${s}`).join(", ");
  }
  return "–";
}

function Pools({ pools }: { pools: Row[] }) {
  return (
    <Section title="Pools">
      <Table label="pools" rows={pools} rowKey={(p) => textOf(p, "name", "pool")} empty="no pools"
        columns={[
          { title: "pool", cell: (p) => textOf(p, "name", "pool") },
          { title: "workers", cell: (p) => textOf(p, "workers", "worker_count", "ready_workers") },
          { title: "free cpu", cell: (p) => cpu(numberOf(p, "free_cpu_millicores", "cpu_free")) },
          { title: "free memory", cell: (p) => `${numberOf(p, "free_memory_mib", "memory_free") ?? 0} MiB` },
          { title: "GPUs", cell: (p) => gpuText(p) },
        ]} />
    </Section>
  );
}

function gpuText(p: Row): string {
  const types = pick<unknown>(p, "gpu_types", "gpus");
  if (Array.isArray(types)) return types.join(", ") || "–";
  if (types && typeof types === "object") return Object.entries(types).map(([t, n]) => `${n}× ${t}`).join(", ") || "–";
  return "–";
}

function Workers({ rows }: { rows: Row[] }) {
  return (
    <Section title="Workers">
      <Table label="workers" rows={rows} rowKey={(w) => textOf(w, "worker_id")} empty="no workers"
        columns={[
          { title: "worker", cell: (w) => <span className="mono">{textOf(w, "worker_id")}</span> },
          { title: "pool", cell: (w) => textOf(w, "pool") },
          { title: "status", cell: (w) => <StatusPill status={textOf(w, "status")} /> },
          { title: "cpu used", cell: (w) => `${cpu(numberOf(w, "cpu_used"))} / ${cpu(numberOf(w, "cpu_millicores"))}` },
          { title: "GPU", cell: (w) => (numberOf(w, "gpu_count") ? `${numberOf(w, "gpu_count")}× ${textOf(w, "gpu_type")}` : "–") },
        ]} />
    </Section>
  );
}

function Failures({ rows }: { rows: Row[] }) {
  return (
    <Section title="Recent failures">
      <Table label="failures" rows={rows} empty="no failures" rowKey={(f) => textOf(f, "id", "event_id", "seq") + textOf(f, "occurred_at", "at")}
        columns={[
          { title: "when", cell: (f) => <span title={timeOf(textOf(f, "occurred_at", "at"))}>{ago(textOf(f, "occurred_at", "at"))}</span> },
          { title: "what", cell: (f) => textOf(f, "type", "kind") },
          { title: "of", cell: (f) => failureSubject(f) },
          { title: "reason", cell: (f) => <span className="reason">{textOf(f, "reason", "error") || textOf(pick(f, "data"), "reason")}</span>, className: "wide" },
          { title: "chain", cell: (f) => <ChainLink id={textOf(f, "correlation_id")} /> },
        ]} />
    </Section>
  );
}

function failureSubject(f: Row) {
  const container = textOf(f, "container_id") || (textOf(f, "aggregate") === "container" ? textOf(f, "aggregate_id") : "");
  return container ? <ContainerLink id={container} /> : <span className="mono">{textOf(f, "aggregate_id")}</span>;
}
