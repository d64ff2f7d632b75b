// The export's 404.html: the backend answers it, with status 404, for a page that does not exist.
import { NotFound } from "@/components/Status";

export default function NotFoundPage() {
  return <NotFound what="This page" />;
}
