"use client";
// One correlation id's causal chain: every event of one user action, as a tree by causation over
// time — what an auditor opens first. It grows live while the action goes on.
import { Suspense } from "react";
import Link from "next/link";
import { ChainTree } from "@/components/ChainTree";
import { ErrorNote, Loading, NotFound, Section } from "@/components/Status";
import { seg } from "@/lib/api";
import type { Chain } from "@/lib/types";
import { useResource } from "@/lib/useResource";
import { useQueryParam } from "@/lib/useQueryParam";

function ChainView() {
  const id = useQueryParam("id");
  const { data, error, notFound } = useResource<Chain>(id ? `/api/chain/${seg(id)}` : null, {},
    (e) => e.correlation_id === id);
  if (!id || notFound) return <NotFound what={id ? `Correlation id ${id}` : "A chain without an id"} />;
  if (error) return <ErrorNote error={error} />;
  if (!data) return <Loading what="the chain" />;
  return (
    <>
      <h1 className="mono">chain {id}</h1>
      <p className="note">
        Each event under the one that caused it, placed on one time axis from the first.{" "}
        <Link href={`/log/?correlation_id=${encodeURIComponent(id)}`}>as a list</Link>
      </p>
      <Section title="Causal chain">
        <ChainTree roots={data.roots} />
      </Section>
    </>
  );
}

export default function ChainPage() {
  return (
    <Suspense>
      <ChainView />
    </Suspense>
  );
}
