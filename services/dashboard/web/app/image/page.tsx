"use client";
// One image build: each step with its state and time as the build goes, and the build's whole log,
// streamed line by line from its events (BuildLog).
import { Suspense } from "react";
import { BuildLog } from "@/components/BuildLog";
import { ErrorNote, Loading, NotFound, Section, StatusPill } from "@/components/Status";
import { seg } from "@/lib/api";
import { bytes, timeOf } from "@/lib/format";
import type { BuildStep, ImageDetail } from "@/lib/types";
import { about, useResource } from "@/lib/useResource";
import { useQueryParam } from "@/lib/useQueryParam";

function ImageView() {
  const id = useQueryParam("id");
  const { data: image, error, notFound } = useResource<ImageDetail>(id ? `/api/v1/images/${seg(id)}` : null, {},
    about(["image"], id));
  if (!id || notFound) return <NotFound what={id ? `Image ${id}` : "An image without an id"} />;
  if (error) return <ErrorNote error={error} />;
  if (!image) return <Loading what="the image" />;
  const steps = image.steps ?? [];
  const done = steps.filter((s) => s.state === "done" || s.state === "cached").length;
  return (
    <>
      <header className="page-head">
        <h1 className="mono">image {image.image_id}</h1>
        <StatusPill status={image.status} />
      </header>
      <dl className="facts card">
        <div><dt>reference</dt><dd className="mono">{image.reference || "–"}</dd></div>
        <div><dt>size</dt><dd>{bytes(image.size_bytes)}</dd></div>
        <div><dt>requested</dt><dd>{timeOf(image.requested_at)}</dd></div>
        <div><dt>built</dt><dd>{timeOf(image.built_at)}</dd></div>
        <div><dt>progress</dt><dd>{done} of {steps.length} steps</dd></div>
        {image.reason && <div><dt>reason</dt><dd className="bad">{image.reason}</dd></div>}
      </dl>
      <Section title="Steps">
        <progress max={Math.max(steps.length, 1)} value={done} style={{ width: "100%" }} />
        <ol className="steps">{steps.map((s) => <Step key={s.index} step={s} failing={s.index === image.failing_step} />)}</ol>
      </Section>
      <Section title="Log">
        <BuildLog imageId={image.image_id} fallback={image.log_tail ?? []} />
      </Section>
    </>
  );
}

function Step({ step, failing }: { step: BuildStep; failing: boolean }) {
  return (
    <li>
      <span className="quiet">{step.index + 1}</span>
      <code>{step.text}</code>
      <StatusPill status={failing ? "failed" : step.state} />
      <span className="quiet">{step.seconds ? `${step.seconds.toFixed(1)} s` : ""}</span>
    </li>
  );
}

export default function ImagePage() {
  return (
    <Suspense>
      <ImageView />
    </Suspense>
  );
}
