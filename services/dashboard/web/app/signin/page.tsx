"use client";
// Sign-in: `levers9 dashboard` prints a one-time URL that signs in by itself; here a token can be
// pasted instead. The backend keeps the token in an HttpOnly cookie; the page never stores it.
import { Suspense, useState, type FormEvent } from "react";
import { send } from "@/lib/api";
import { useQueryParam } from "@/lib/useQueryParam";

function safeNext(next: string): string {
  return next.startsWith("/") && !next.startsWith("//") ? next : "/";
}

function SignInForm() {
  const next = safeNext(useQueryParam("next"));
  const [token, setToken] = useState("");
  const [error, setError] = useState("");
  const [sending, setSending] = useState(false);
  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setSending(true);
    setError("");
    try {
      await send("POST", "/api/session", { token: token.trim() });
      window.location.assign(next);
    } catch (err) {
      setError((err as Error).message);
      setSending(false);
    }
  };
  return (
    <form className="signin card" onSubmit={submit}>
      <h1>levers9</h1>
      <p>
        Run <code>levers9 dashboard --open</code> to sign in with your profile, or paste a token of your
        workspace.
      </p>
      <label htmlFor="token">token</label>
      <input id="token" name="token" type="password" autoComplete="off" value={token}
        onChange={(e) => setToken(e.target.value)} required />
      <button type="submit" disabled={sending || !token.trim()}>{sending ? "signing in…" : "sign in"}</button>
      {error && <p className="note bad" role="alert">{error}</p>}
    </form>
  );
}

export default function SignInPage() {
  return (
    <Suspense>
      <SignInForm />
    </Suspense>
  );
}
