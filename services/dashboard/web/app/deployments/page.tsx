"use client";
// Deployments: each name once, its latest version and state, how many versions it has had, its live
// containers against the autoscaler's desired count.
import { ActionButton } from "@/components/ActionButton";
import { DeploymentLink } from "@/components/Links";
import { ErrorNote, Loading, StatusPill } from "@/components/Status";
import { Table } from "@/components/Table";
import { seg } from "@/lib/api";
import { ago, timeOf } from "@/lib/format";
import { byName } from "@/lib/deployments";
import type { Deployment } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";

/** "live / desired", as `levers9 deployments list` shows them. */
function scale(d: Deployment): string {
  if (d.containers === undefined) return "–";
  return `${d.containers} / ${d.desired ?? "?"}`;
}

export default function DeploymentsPage() {
  const { data, error } = useResource<Deployment[]>("/api/v1/deployments", {}, about(["deployment", "container"]));
  return (
    <>
      <h1>Deployments</h1>
      <ErrorNote error={error} />
      {!data && !error && <Loading what="deployments" />}
      {data && (
        <Table label="deployments" rows={byName(data)} rowKey={(d) => d.latest.name} empty="nothing deployed yet"
          columns={[
            { title: "name", cell: (d) => <DeploymentLink name={d.latest.name} /> },
            { title: "version", cell: (d) => `v${d.latest.version}`, className: "num" },
            { title: "versions", cell: (d) => d.versions.length, className: "num" },
            { title: "status", cell: (d) => <StatusPill status={d.latest.status} /> },
            { title: "kind", cell: (d) => String(d.latest.spec?.kind ?? "") },
            { title: "containers", cell: (d) => scale(d.latest), className: "num" },
            { title: "deployed", cell: (d) => <span title={timeOf(d.latest.created_at)}>{ago(d.latest.created_at)}</span> },
            {
              title: "",
              cell: (d) => d.latest.status === "active" && (
                <ActionButton label="stop" danger path={`/api/deployments/${seg(d.latest.name)}/stop`}
                  confirm={`Stop ${d.latest.name}? Its containers stop.`} />
              ),
            },
          ]} />
      )}
    </>
  );
}
