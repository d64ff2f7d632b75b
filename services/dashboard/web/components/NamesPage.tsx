"use client";
// Volumes, secrets and tokens are shown by name only: the API never gives a value, and nor does this.
import { ErrorNote, Loading, StatusPill } from "./Status";
import { Table } from "./Table";
import { ago, timeOf } from "@/lib/format";
import { about, useResource } from "@/lib/useResource";

type Row = Record<string, unknown>;

function textOf(row: Row, ...keys: string[]): string {
  const key = keys.find((k) => row[k] !== undefined && row[k] !== null);
  return key === undefined ? "" : String(row[key]);
}

interface NamesPageProps {
  title: string;
  path: string;
  aggregate: string;
  idKey?: string;
}

export function NamesPage({ title, path, aggregate, idKey = "name" }: NamesPageProps) {
  const { data, error } = useResource<Row[]>(path, {}, about([aggregate]));
  return (
    <>
      <h1>{title}</h1>
      <p className="note">names only: values never leave the platform</p>
      <ErrorNote error={error} />
      {!data && !error && <Loading what={title.toLowerCase()} />}
      {data && (
        <Table label={title.toLowerCase()} rows={data} rowKey={(r) => textOf(r, idKey)} empty={`no ${title.toLowerCase()}`}
          columns={[
            { title: "name", cell: (r) => <strong>{textOf(r, "name")}</strong> },
            ...(data.some((r) => "scope" in r) ? [{ title: "scope", cell: (r: Row) => textOf(r, "scope") }] : []),
            ...(data.some((r) => "revoked" in r)
              ? [{ title: "state", cell: (r: Row) => <StatusPill status={r.revoked ? "revoked" : "active"} /> }] : []),
            {
              title: "since",
              cell: (r) => {
                const at = textOf(r, "updated_at", "created_at");
                return <span title={timeOf(at)}>{ago(at)}</span>;
              },
            },
          ]} />
      )}
    </>
  );
}
