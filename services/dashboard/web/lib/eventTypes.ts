// Every event type of levers9.contracts.events (EVENT_TYPES). The browser's EventSource only hands a
// named SSE event (`event: ContainerReady`) to a listener registered for that name, so the live
// connection registers one per type. tests/browser/test_event_types.py keeps this list complete.
export const EVENT_TYPES: readonly string[] = [
  "CatalogueBuilt", "CheckpointDeleted", "CheckpointDumped", "CheckpointFailed", "CheckpointStored",
  "ClusterAttached", "ClusterDetached", "ClusterShared", "ContainerCheckpointRequested", "ContainerFailed",
  "ContainerReady", "ContainerRequested", "ContainerScheduled", "ContainerStarted", "ContainerStopRequested",
  "ContainerStopped", "DeploymentCheckpointClaimed", "DeploymentCreated", "DeploymentDeleted",
  "DeploymentScaled", "DeploymentStopped", "FunctionCallFinished", "FunctionCallStarted", "ImageBuildFailed",
  "ImageBuildProgress", "ImageBuildRequested", "ImageBuildStarted", "ImageBuilt", "ImageDeleted",
  "ImagePushed", "PlacementDeferred", "SandboxCreated", "SandboxSnapshotted", "SandboxTerminated",
  "ScheduleFired", "SecretDeleted", "SecretSet", "TaskCancelled",
  "TaskEnqueued", "TaskExpired", "TaskFailed", "TaskRetried", "TaskStarted", "TaskSucceeded", "TokenCreated",
  "TokenRevoked", "VolumeCreated", "VolumeDeleted", "WorkerCatalogueChecked", "WorkerCordoned",
  "WorkerDrained", "WorkerFenced", "WorkerLost", "WorkerProvisioned", "WorkerReady", "WorkerRegistered",
  "WorkerSlotReleased", "WorkerSlotReserved", "WorkerUncordoned",
];
