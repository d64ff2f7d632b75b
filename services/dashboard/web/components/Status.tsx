// A state as a coloured word, and the small notes pages show while loading or failing.
import type { ReactNode } from "react";

const TONE: Record<string, string> = {
  ready: "good", active: "good", built: "good", available: "good", ok: "good", succeeded: "good",
  finished: "good", live: "good",
  requested: "busy", scheduled: "busy", started: "busy", starting: "busy", building: "busy", running: "busy",
  pushed: "busy", dumped: "busy", provisioned: "busy", registered: "busy", connecting: "busy",
  reconnecting: "busy", waiting: "quiet", cached: "quiet", done: "good",
  stopped: "quiet", deleted: "quiet", cancelled: "quiet", revoked: "quiet", drained: "quiet", off: "quiet",
  failed: "bad", error: "bad", lost: "bad", timeout: "bad", fenced: "bad",
};

export function StatusPill({ status }: { status: string }) {
  return <span className={`pill ${TONE[status] ?? "quiet"}`}>{status || "–"}</span>;
}

export function Loading({ what }: { what: string }) {
  return <p className="note" role="status">loading {what}…</p>;
}

export function ErrorNote({ error }: { error: Error | null }) {
  return error ? <p className="note bad" role="alert">{error.message}</p> : null;
}

export function Section({ title, children, actions }: { title: string; children: ReactNode; actions?: ReactNode }) {
  return (
    <section className="card" aria-label={title}>
      <header className="card-head">
        <h2>{title}</h2>
        {actions}
      </header>
      {children}
    </section>
  );
}

export function NotFound({ what }: { what: string }) {
  return (
    <div className="not-found" data-testid="not-found">
      <h1>404</h1>
      <p>{what} was not found in this workspace.</p>
      <a href="/">back to the overview</a>
    </div>
  );
}
