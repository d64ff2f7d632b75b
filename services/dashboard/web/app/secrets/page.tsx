"use client";
import { NamesPage } from "@/components/NamesPage";

export default function SecretsPage() {
  return <NamesPage title="Secrets" path="/api/v1/secrets" aggregate="secret" />;
}
