// Links to one thing's page; ids go in the query string (the static export has one file per page).
import Link from "next/link";
import { shortId } from "@/lib/format";

export function ContainerLink({ id }: { id: string }) {
  return id ? <Link href={`/container/?id=${encodeURIComponent(id)}`} className="mono" title={id}>{shortId(id)}</Link> : null;
}

export function DeploymentLink({ name }: { name: string | null | undefined }) {
  return name ? <Link href={`/deployment/?name=${encodeURIComponent(name)}`}>{name}</Link> : <span className="quiet">–</span>;
}

export function ChainLink({ id }: { id: string }) {
  return id ? <Link href={`/chain/?id=${encodeURIComponent(id)}`} className="mono" title={`the chain of ${id}`}>{shortId(id)}</Link> : null;
}

export function ImageLink({ id }: { id: string }) {
  return id ? <Link href={`/image/?id=${encodeURIComponent(id)}`} className="mono" title={id}>{shortId(id, 12)}</Link> : null;
}

export function TaskLink({ id, label }: { id: string; label?: string }) {
  return id ? <Link href={`/task/?id=${encodeURIComponent(id)}`} className="mono" title={id}>{label ?? shortId(id)}</Link> : null;
}

export function CallLink({ id }: { id: string }) {
  return id ? <Link href={`/call/?id=${encodeURIComponent(id)}`} className="mono" title={id}>{shortId(id)}</Link> : null;
}
