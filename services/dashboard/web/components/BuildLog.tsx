"use client";
// An image build's whole log, streamed: the lines its ImageBuildProgress events carry, read once from
// the event log (newest pages first, up to KEEP lines) and then appended as each event arrives on the
// tab's live stream, in sequence order, none twice (events seen while the history loads are held and
// merged by seq). A gap in the live stream (a reconnect) reads the history again.
import { useEffect, useRef, useState } from "react";
import { getJSON } from "@/lib/api";
import { useLiveEvents } from "@/lib/live";
import type { LevEvent } from "@/lib/types";

const KEEP = 5000;
const PAGE = 1000;

interface Batch {
  seq: number;
  lines: string[];
}

function batchOf(e: LevEvent): Batch {
  const lines = (e.data as { lines?: unknown }).lines;
  return { seq: e.seq, lines: Array.isArray(lines) ? lines.map(String) : [] };
}

export function BuildLog({ imageId, fallback }: { imageId: string; fallback: string[] }) {
  const [batches, setBatches] = useState<Map<number, Batch> | null>(null);
  const [epoch, setEpoch] = useState(0);
  const held = useRef<Batch[] | null>([]); // live batches that came while the history loads
  const box = useRef<HTMLPreElement>(null);

  useLiveEvents((event) => {
    if (event === null) return setEpoch((n) => n + 1);
    if (event.type !== "ImageBuildProgress" || event.aggregate_id !== imageId) return;
    const batch = batchOf(event);
    if (held.current !== null) held.current.push(batch);
    else setBatches((had) => new Map(had ?? []).set(batch.seq, batch));
  });

  useEffect(() => {
    const abort = new AbortController();
    held.current = [];
    history(imageId, abort.signal)
      .then((found) => {
        const all = new Map(found.map((b) => [b.seq, b]));
        for (const b of held.current ?? []) all.set(b.seq, b);
        held.current = null;
        setBatches(all);
      })
      .catch((err: Error) => {
        if (err.name !== "AbortError") {
          held.current = null;
          setBatches(new Map()); // the live lines still come; the tail below stands for the rest
        }
      });
    return () => abort.abort();
  }, [imageId, epoch]);

  const lines = batches === null ? [] : [...batches.values()].sort((a, b) => a.seq - b.seq).flatMap((b) => b.lines);
  const shown = lines.length ? lines.slice(-KEEP) : fallback;

  useEffect(() => {
    const el = box.current;
    if (el && el.scrollHeight - el.scrollTop - el.clientHeight < 80) el.scrollTop = el.scrollHeight;
  }, [shown.length]);

  return (
    <div className="logs">
      {lines.length > KEEP && <p className="note">the first {lines.length - KEEP} lines are not shown</p>}
      <pre ref={box} data-testid="build-log">{shown.join("\n") || (batches === null ? "loading…" : "no output yet")}</pre>
    </div>
  );
}

/** The build's progress events, oldest first, read newest page first (the event list pages backwards). */
async function history(imageId: string, signal: AbortSignal): Promise<Batch[]> {
  const out: Batch[] = [];
  let before = "";
  let lines = 0;
  while (lines < KEEP) {
    const answer = await getJSON<LevEvent[]>("/api/v1/events", {
      type: "ImageBuildProgress", aggregate: "image", aggregate_id: imageId, limit: PAGE, before,
    }, signal);
    for (const e of answer.body) {
      const b = batchOf(e);
      out.push(b);
      lines += b.lines.length;
    }
    if (!answer.nextBefore || answer.body.length === 0) break;
    before = answer.nextBefore;
  }
  return out.reverse();
}
