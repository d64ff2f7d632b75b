"use client";
import { NamesPage } from "@/components/NamesPage";

export default function TokensPage() {
  return <NamesPage title="Tokens" path="/api/v1/tokens" aggregate="token" idKey="token_id" />;
}
