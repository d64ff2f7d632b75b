// A static export: levers9.dashboard serves out/ itself, so nothing here may need a Node server
// (no route handlers, no middleware, no image optimisation); ids travel in query strings.
import type { NextConfig } from "next";

const config: NextConfig = {
  output: "export",
  trailingSlash: true,
  images: { unoptimized: true },
  poweredByHeader: false,
  reactStrictMode: true,
};

export default config;
