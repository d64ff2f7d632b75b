"use client";
// A GET that follows the log: fetched when its URL changes and again when a matching live event
// arrives. The last answer stays on screen while the next one loads.

import { useEffect, useState } from "react";
import { getJSON, withQuery, type Answer, type Params } from "./api";
import { useLiveVersion } from "./live";
import type { LevEvent } from "./types";

export interface Resource<T> {
  answer: Answer<T> | null;
  error: Error | null;
  loading: boolean;
}

export function useResource<T>(
  path: string | null,
  params: Params = {},
  refreshOn: ((event: LevEvent) => boolean) | null = null,
): Resource<T> & { data: T | null; notFound: boolean } {
  const url = path === null ? null : withQuery(path, params);
  const version = useLiveVersion(refreshOn);
  const [state, setState] = useState<Resource<T>>({ answer: null, error: null, loading: true });
  useEffect(() => {
    if (url === null) return;
    const abort = new AbortController();
    setState((s) => ({ ...s, loading: true }));
    getJSON<T>(url, {}, abort.signal)
      .then((answer) => setState({ answer, error: null, loading: false }))
      .catch((error: Error) => {
        if (error.name !== "AbortError") setState((s) => ({ ...s, error, loading: false }));
      });
    return () => abort.abort();
  }, [url, version]);
  const notFound = (state.error as { status?: number } | null)?.status === 404;
  return { ...state, data: state.answer?.body ?? null, notFound };
}

/** Events of these aggregates (and, when given, this aggregate id). */
export function about(aggregates: string[], id?: string | null): (event: LevEvent) => boolean {
  return (event) => aggregates.includes(event.aggregate) && (!id || event.aggregate_id === id);
}
