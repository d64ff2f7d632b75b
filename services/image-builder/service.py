"""The image-builder process. Keeps the view of image builds; building itself comes later."""

from __future__ import annotations

from levers9.runtime.service import Service
from levers9.runtime.views import ImageBuildsView


class ImageBuilderService(Service):
    name = "image-builder"
    projections = (ImageBuildsView(),)
