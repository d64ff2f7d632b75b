"use client";
// A button that changes something (stop, cordon, drain, cancel): asks first, sends the request with
// the CSRF header, and says what happened. What it changed arrives through the live events.
import { useState } from "react";
import { send } from "@/lib/api";

interface ActionButtonProps {
  label: string;
  path: string;
  confirm?: string;
  method?: "POST" | "DELETE";
  danger?: boolean;
  disabled?: boolean;
  onDone?: () => void;
}

export function ActionButton({ label, path, confirm, method = "POST", danger, disabled, onDone }: ActionButtonProps) {
  const [state, setState] = useState<"idle" | "sending" | "sent">("idle");
  const [error, setError] = useState("");
  const run = async () => {
    if (confirm && !window.confirm(confirm)) return;
    setState("sending");
    setError("");
    try {
      await send(method, path);
      setState("sent");
      onDone?.();
    } catch (err) {
      setError((err as Error).message);
      setState("idle");
    }
  };
  return (
    <span className="action">
      <button type="button" className={danger ? "danger" : undefined} disabled={disabled || state === "sending"}
        onClick={run}>
        {state === "sending" ? `${label}…` : label}
      </button>
      {state === "sent" && <span className="note good" role="status">asked</span>}
      {error && <span className="note bad" role="alert">{error}</span>}
    </span>
  );
}
