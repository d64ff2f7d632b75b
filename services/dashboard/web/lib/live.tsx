"use client";
// One EventSource('/events') per tab, shared by every view through a context: a view subscribes
// with a predicate and refetches (coalesced) when a matching event arrives. No timers poll anything.
// The browser reconnects by itself with Last-Event-ID; when the server closes the stream for good
// (a restart answered 502/503, a lost session answered 401) this reopens it after a back-off with
// `after=<last seq>`, and tells every view to refetch once, since events may have been missed.

import { createContext, useContext, useEffect, useMemo, useRef, useState, type ReactNode } from "react";
import { usePathname } from "next/navigation";
import { goToSignIn } from "./api";
import { EVENT_TYPES } from "./eventTypes";
import type { LevEvent } from "./types";

export type LiveStatus = "connecting" | "live" | "reconnecting" | "off";
/** An event, or null: "you may have missed some, look again". */
type Listener = (event: LevEvent | null) => void;

class LiveBus {
  private listeners = new Set<Listener>();
  subscribe(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
  emit(event: LevEvent | null): void {
    for (const listener of this.listeners) listener(event);
  }
}

interface Live {
  bus: LiveBus;
  status: LiveStatus;
}

const LiveContext = createContext<Live | null>(null);

const MAX_BACKOFF_MS = 15000;

function connect(bus: LiveBus, setStatus: (s: LiveStatus) => void): () => void {
  let source: EventSource | null = null;
  let lastSeq = "";
  let backoff = 500;
  let retry: ReturnType<typeof setTimeout> | undefined;
  let stopped = false;

  const onEvent = (message: MessageEvent<string>) => {
    if (message.lastEventId) lastSeq = message.lastEventId;
    try {
      bus.emit(JSON.parse(message.data) as LevEvent);
    } catch {
      /* a comment or a malformed line: nothing to show */
    }
  };
  const reopenLater = () => {
    if (stopped) return;
    retry = setTimeout(open, backoff);
    backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
  };
  const onClosed = () => {
    setStatus("reconnecting");
    fetch("/api/me", { headers: { Accept: "application/json" } })
      .then((resp) => (resp.status === 401 ? (setStatus("off"), goToSignIn()) : reopenLater()))
      .catch(reopenLater);
  };
  function open() {
    if (stopped) return;
    source = new EventSource(lastSeq ? `/events?after=${encodeURIComponent(lastSeq)}` : "/events");
    let reopened = lastSeq !== "";
    source.onopen = () => {
      setStatus("live");
      backoff = 500;
      if (reopened) bus.emit(null);
      reopened = false;
    };
    source.onmessage = onEvent;
    for (const type of EVENT_TYPES) source.addEventListener(type, onEvent as EventListener);
    source.onerror = () => {
      if (source?.readyState === EventSource.CLOSED) {
        source.close();
        onClosed();
      } else {
        setStatus("reconnecting"); // the browser retries by itself, sending Last-Event-ID
      }
    };
  }
  open();
  return () => {
    stopped = true;
    clearTimeout(retry);
    source?.close();
  };
}

export function LiveProvider({ children }: { children: ReactNode }) {
  const pathname = usePathname() ?? "/";
  const bus = useMemo(() => new LiveBus(), []);
  const [status, setStatus] = useState<LiveStatus>("connecting");
  const signedOutPage = pathname.startsWith("/signin");
  useEffect(() => (signedOutPage ? undefined : connect(bus, setStatus)), [bus, signedOutPage]);
  const value = useMemo(() => ({ bus, status: signedOutPage ? "off" : status }), [bus, status, signedOutPage]);
  return <LiveContext.Provider value={value}>{children}</LiveContext.Provider>;
}

function useLive(): Live {
  const live = useContext(LiveContext);
  if (!live) throw new Error("useLive outside LiveProvider");
  return live;
}

export function useLiveStatus(): LiveStatus {
  return useLive().status;
}

/** Calls `handler` for each live event (null after a gap). The handler may change every render. */
export function useLiveEvents(handler: Listener): void {
  const { bus } = useLive();
  const latest = useRef(handler);
  latest.current = handler;
  useEffect(() => bus.subscribe((event) => latest.current(event)), [bus]);
}

const COALESCE_MS = 250;

/** A number that goes up (at most every 250 ms) when an event that `matches` arrives, or after a gap. */
export function useLiveVersion(matches: ((event: LevEvent) => boolean) | null): number {
  const [version, setVersion] = useState(0);
  const pending = useRef<ReturnType<typeof setTimeout> | undefined>(undefined);
  useEffect(() => () => clearTimeout(pending.current), []);
  useLiveEvents((event) => {
    if (matches === null || (event !== null && !matches(event)) || pending.current !== undefined) return;
    pending.current = setTimeout(() => {
      pending.current = undefined;
      setVersion((v) => v + 1);
    }, COALESCE_MS);
  });
  return version;
}
