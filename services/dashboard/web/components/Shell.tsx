"use client";
// The frame around every page: the navigation (a side bar on a desk, a strip on a phone), the
// workspace, whether the live stream is up, and sign-out. The sign-in page gets no frame.
import Link from "next/link";
import { usePathname } from "next/navigation";
import type { ReactNode } from "react";
import { send } from "@/lib/api";
import { useLiveStatus } from "@/lib/live";
import { useResource } from "@/lib/useResource";
import type { Me } from "@/lib/types";

const NAV: [string, string][] = [
  ["/", "Overview"],
  ["/deployments/", "Deployments"],
  ["/containers/", "Containers"],
  ["/calls/", "Function calls"],
  ["/tasks/", "Tasks"],
  ["/images/", "Images"],
  ["/checkpoints/", "Checkpoints"],
  ["/workers/", "Workers"],
  ["/log/", "Event log"],
  ["/volumes/", "Volumes"],
  ["/secrets/", "Secrets"],
  ["/tokens/", "Tokens"],
];

/** Which nav entry a path belongs to: /container/?id= is under Containers. */
function section(pathname: string): string {
  const singular: Record<string, string> = {
    "/deployment/": "/deployments/", "/container/": "/containers/", "/call/": "/calls/", "/task/": "/tasks/",
    "/image/": "/images/", "/chain/": "/log/",
  };
  return singular[pathname] ?? pathname;
}

export function Shell({ children }: { children: ReactNode }) {
  const pathname = usePathname() ?? "/";
  if (pathname.startsWith("/signin")) return <main className="bare">{children}</main>;
  const current = section(pathname.endsWith("/") ? pathname : `${pathname}/`);
  return (
    <div className="shell">
      <header className="topbar">
        <Link href="/" className="brand">levers9</Link>
        <WorkspaceName />
        <LiveBadge />
        <button type="button" className="link" onClick={signOut}>sign out</button>
      </header>
      <nav className="sidenav" aria-label="pages">
        {NAV.map(([href, label]) => (
          <Link key={href} href={href} className={current === href ? "current" : undefined}
            aria-current={current === href ? "page" : undefined}>
            {label}
          </Link>
        ))}
      </nav>
      <main className="content">{children}</main>
    </div>
  );
}

function WorkspaceName() {
  const { data } = useResource<Me>("/api/me");
  return <span className="workspace" data-testid="workspace">{data ? `workspace ${data.workspace}` : ""}</span>;
}

function LiveBadge() {
  const status = useLiveStatus();
  return <span className={`live ${status}`} data-testid="live" title="the event stream">{status}</span>;
}

async function signOut() {
  try {
    await send("DELETE", "/api/session");
  } finally {
    window.location.assign("/signin/");
  }
}
