"use client";
// One container: what it is, its cold-start waterfall, its live log, and its events. Another
// workspace's container (or none) is a 404 here, as the backend answers.
import { Suspense, type ReactNode } from "react";
import { ActionButton } from "@/components/ActionButton";
import { EventTable } from "@/components/EventTable";
import { ChainLink, DeploymentLink } from "@/components/Links";
import { LogFollow } from "@/components/LogFollow";
import { ErrorNote, Loading, NotFound, Section, StatusPill } from "@/components/Status";
import { Waterfall } from "@/components/Waterfall";
import { seg } from "@/lib/api";
import { cpu, timeOf } from "@/lib/format";
import type { Container, Deployment, LevEvent, Waterfall as WaterfallData } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";
import { useQueryParam } from "@/lib/useQueryParam";

const STOPPED = new Set(["stopped", "failed"]);

function ContainerView() {
  const id = useQueryParam("id");
  const mine = about(["container"], id);
  const { data: c, error, notFound } = useResource<Container>(id ? `/api/v1/containers/${seg(id)}` : null, {}, mine);
  if (!id || notFound) return <NotFound what={id ? `Container ${id}` : "A container without an id"} />;
  if (error) return <ErrorNote error={error} />;
  if (!c) return <Loading what="the container" />;
  return (
    <>
      <header className="page-head">
        <h1 className="mono" title={c.container_id}>container {c.container_id}</h1>
        <StatusPill status={c.status} />
        {!STOPPED.has(c.status) && (
          <ActionButton label="stop" danger path={`/api/containers/${seg(c.container_id)}/stop`}
            confirm="Stop this container?" />
        )}
      </header>
      <Facts c={c} />
      <div className="grid-2">
        <Section title="Cold start">
          <ColdStart id={c.container_id} />
        </Section>
        <Section title="Log">
          <LogFollow containerId={c.container_id} />
        </Section>
      </div>
      <Events id={c.container_id} />
    </>
  );
}

/** The container's deployment by name: its own row has only the deployment's id. */
function useDeploymentName(c: Container): string | null {
  const { data } = useResource<Deployment[]>(c.deployment_id && !c.deployment_name ? "/api/v1/deployments" : null);
  return c.deployment_name ?? data?.find((d) => d.deployment_id === c.deployment_id)?.name ?? null;
}

function Facts({ c }: { c: Container }) {
  const deployment = useDeploymentName(c);
  const facts: [string, ReactNode][] = [
    ["deployment", <DeploymentLink key="d" name={deployment} />],
    ["worker", <span key="w" className="mono">{c.worker_id || "–"}</span>],
    ["pool", c.pool],
    ["size", `${cpu(c.cpu_millicores)}, ${c.memory_mib} MiB${c.gpu_count ? `, ${c.gpu_count} GPU` : ""}`],
    ["started from", c.restored_from ? `checkpoint ${c.restored_from}` : c.worker_id ? "cold" : "–"],
    ["requested", timeOf(c.requested_at)],
    ["ready", timeOf(c.ready_at)],
    ["correlation", <ChainLink key="c" id={c.correlation_id} />],
    ["reason", c.reason || c.note || "–"],
  ];
  return (
    <dl className="facts card">
      {facts.map(([k, v]) => (
        <div key={k}><dt>{k}</dt><dd>{v}</dd></div>
      ))}
    </dl>
  );
}

function ColdStart({ id }: { id: string }) {
  const { data, error } = useResource<WaterfallData>(`/api/containers/${seg(id)}/waterfall`, {},
    (e) => (e.aggregate === "container" && e.aggregate_id === id) || (e.aggregate === "call" && e.data?.container_id === id));
  if (error) return <ErrorNote error={error} />;
  if (!data) return <Loading what="the waterfall" />;
  return <Waterfall waterfall={data} />;
}

function Events({ id }: { id: string }) {
  const { data, error } = useResource<LevEvent[]>("/api/v1/events", { aggregate: "container", aggregate_id: id, limit: 100 },
    about(["container"], id));
  return (
    <Section title="Events">
      <ErrorNote error={error} />
      {data ? <EventTable events={data} label="container events" /> : !error && <Loading what="events" />}
    </Section>
  );
}

export default function ContainerPage() {
  return (
    <Suspense>
      <ContainerView />
    </Suspense>
  );
}
