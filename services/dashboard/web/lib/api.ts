// Talking to the dashboard's backend (same origin, the session cookie goes by itself).
// Reads answer the body with the paging headers the gateway sets; changes carry the CSRF token the
// backend put in the readable `levers9_csrf` cookie. A 401 anywhere means the session is gone: the
// browser goes to the sign-in page and comes back here after.

export type Params = Record<string, string | number | boolean | null | undefined>;

export class HttpError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
  }
}

export interface Answer<T> {
  body: T;
  /** X-Total-Count: how many match in all (offset paging) */
  total: number | null;
  /** X-Next-Before: the seq to ask `before=` for the next, older page */
  nextBefore: string | null;
}

export function withQuery(path: string, params: Params = {}): string {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return text ? `${path}${path.includes("?") ? "&" : "?"}${text}` : path;
}

export function csrfToken(): string {
  const found = document.cookie.split(";").map((c) => c.trim()).find((c) => c.startsWith("levers9_csrf="));
  return found ? decodeURIComponent(found.slice("levers9_csrf=".length)) : "";
}

export function goToSignIn(): void {
  if (window.location.pathname.startsWith("/signin")) return;
  const back = window.location.pathname + window.location.search;
  window.location.assign(`/signin/?next=${encodeURIComponent(back)}`);
}

async function problem(resp: Response): Promise<HttpError> {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    const detail = body?.detail ?? body?.error ?? body?.message;
    if (typeof detail === "string") message = detail;
  } catch {
    /* not JSON: the status line says enough */
  }
  if (resp.status === 401) goToSignIn();
  return new HttpError(resp.status, message);
}

/** A GET, tried once more when the network fails under it (a read changes nothing, so a second try is
 *  safe): Chromium aborts requests in flight when the host's interfaces change, as they do on a worker
 *  host whenever a container's veth comes or goes. */
async function fetchRead(url: string, signal?: AbortSignal): Promise<Response> {
  const init: RequestInit = { headers: { Accept: "application/json" }, signal };
  try {
    return await fetch(url, init);
  } catch (err) {
    if (signal?.aborted || !(err instanceof TypeError)) throw err;
    return await fetch(url, init);
  }
}

export async function getJSON<T>(path: string, params: Params = {}, signal?: AbortSignal): Promise<Answer<T>> {
  const resp = await fetchRead(withQuery(path, params), signal);
  if (!resp.ok) throw await problem(resp);
  const total = resp.headers.get("X-Total-Count");
  return {
    body: (await resp.json()) as T,
    total: total === null ? null : Number(total),
    nextBefore: resp.headers.get("X-Next-Before"),
  };
}

/** A change: POST (or DELETE) with the CSRF header; answers the JSON body, if any. */
export async function send(method: "POST" | "DELETE", path: string, body?: unknown): Promise<unknown> {
  const headers: Record<string, string> = { Accept: "application/json", "X-CSRF-Token": csrfToken() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  if (!resp.ok) throw await problem(resp);
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

/** Path segments are ids the user may have typed: never let one change the path. */
export function seg(id: string): string {
  return encodeURIComponent(id);
}
