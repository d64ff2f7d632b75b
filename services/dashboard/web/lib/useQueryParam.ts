"use client";
// The static export has one HTML file per page: the id a page shows rides in the query string.
import { useSearchParams } from "next/navigation";

export function useQueryParam(name: string): string {
  return useSearchParams()?.get(name) ?? "";
}
