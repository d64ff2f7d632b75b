"""Image builds on a build-pool worker: the build consumer and its steps (builder) over buildah (buildah)."""
