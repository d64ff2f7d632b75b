"use client";
import { NamesPage } from "@/components/NamesPage";

export default function VolumesPage() {
  return <NamesPage title="Volumes" path="/api/v1/volumes" aggregate="volume" />;
}
