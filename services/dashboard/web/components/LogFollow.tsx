"use client";
// A container's log, followed: one streamed GET (the worker's log, `follow=true`) read line by line
// as it arrives; opened again when the container (re)starts. Keeps the last 2,000 lines.
import { useEffect, useRef, useState } from "react";
import { seg } from "@/lib/api";
import { useLiveVersion } from "@/lib/live";

const KEEP = 2000;
const RESTARTS = new Set(["ContainerStarted", "ContainerReady"]);

export function LogFollow({ containerId }: { containerId: string }) {
  const [lines, setLines] = useState<string[]>([]);
  const [note, setNote] = useState("connecting…");
  const box = useRef<HTMLPreElement>(null);
  const again = useLiveVersion((e) => e.aggregate === "container" && e.aggregate_id === containerId && RESTARTS.has(e.type));

  useEffect(() => {
    const abort = new AbortController();
    setLines([]); // the worker sends the log from its start each time
    follow(containerId, abort.signal, (more) => setLines((had) => [...had, ...more].slice(-KEEP)), setNote);
    return () => abort.abort();
  }, [containerId, again]);

  useEffect(() => {
    const el = box.current;
    if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 80) el.scrollTop = el.scrollHeight;
  }, [lines]);

  return (
    <div className="logs">
      <p className="note" role="status">{note}</p>
      <pre ref={box} data-testid="logs">{lines.join("\n")}</pre>
    </div>
  );
}

async function follow(id: string, signal: AbortSignal, onLines: (lines: string[]) => void, onNote: (n: string) => void) {
  try {
    const resp = await fetch(`/api/v1/containers/${seg(id)}/logs?follow=true`, { signal });
    if (!resp.ok || !resp.body) {
      onNote(resp.status === 404 ? "no logs yet (not placed on a worker)" : `logs: ${resp.status} ${resp.statusText}`);
      return;
    }
    onNote("following");
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let partial = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const parts = (partial + value).split("\n");
      partial = parts.pop() ?? "";
      if (parts.length) onLines(parts);
    }
    if (partial) onLines([partial]);
    onNote("the log stream ended; it opens again when the container starts");
  } catch (err) {
    if ((err as Error).name !== "AbortError") onNote(`logs: ${(err as Error).message}`);
  }
}
