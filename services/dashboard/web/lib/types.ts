// The shapes the dashboard's backend answers (the gateway's /api/v1 rows passed through, and the
// backend's composed views). Fields the page does not read are left out; anything optional here may
// be absent in an older backend, so pages check before they draw.

export type Json = Record<string, unknown>;

/** One event of the log, as /events streams it and /api/v1/events lists it. */
export interface LevEvent {
  seq: number;
  id: string;
  type: string;
  version?: number;
  occurred_at: string;
  workspace: string;
  aggregate: string;
  aggregate_id: string;
  correlation_id: string;
  causation_id: string;
  data: Json;
}

export interface Deployment {
  deployment_id: string;
  name: string;
  version: number;
  status: string;
  created_at: string;
  spec?: Json;
  /** live containers (requested … ready) */
  containers?: number;
  /** what the autoscaling policy wants now; null: not known to this gateway yet */
  desired?: number | null;
}

export interface Container {
  container_id: string;
  deployment_id: string;
  deployment_name?: string | null;
  deployment_version?: number;
  status: string;
  worker_id: string;
  address?: string;
  cpu_millicores: number;
  memory_mib: number;
  gpu?: string[];
  gpu_count?: number;
  pool: string;
  checkpoint_id?: string;
  restored_from?: string;
  reason?: string;
  note?: string;
  exit_code?: number | null;
  requested_at?: string | null;
  ready_at?: string | null;
  updated_at: string;
  correlation_id: string;
  attempt?: number;
}

export interface Worker {
  worker_id: string;
  pool: string;
  status: string;
  cpu_millicores: number;
  memory_mib: number;
  cpu_used: number;
  memory_used: number;
  gpu_type: string;
  gpu_count: number;
  gpu_used: number;
  features: string[];
  backend: string;
  cordoned: boolean;
  draining: boolean;
  updated_at: string;
  cluster?: string;
}

export interface Checkpoint {
  checkpoint_id: string;
  deployment_id: string;
  deployment_version: number;
  container_id: string;
  worker_id: string;
  status: string;
  size_bytes: number;
  accelerator?: string;
  runtime?: string;
  reason?: string;
  created_at: string | null;
  updated_at: string;
  last_restored_at: string | null;
  restores: number;
}

export interface ImageSummary {
  image_id: string;
  status: string;
  size_bytes: number;
  requested_at: string | null;
  built_at: string | null;
  updated_at: string;
  steps: number;
  reference: string;
  requested_by: string;
  reason: string;
}

export interface BuildStep {
  index: number;
  text: string;
  state: string;
  seconds?: number;
  lines?: string[];
}

export interface ImageDetail extends Omit<ImageSummary, "steps"> {
  steps: BuildStep[] | null;
  builder?: string;
  failing_step?: number;
  log_tail?: string[] | null;
  cached_steps?: number;
}

export interface FunctionCall {
  call_id: string;
  function: string;
  deployment_id?: string;
  /** running | retrying | ok | error | timeout | cancelled | failed */
  state: string;
  mode?: string;
  attempts?: number;
  container_id?: string;
  started_at?: string | null;
  finished_at?: string | null;
  duration_ms?: number | null;
  error_type?: string;
  error_message?: string;
  reason?: string;
  traceback?: string | null;
  correlation_id?: string;
}

export interface NamedThing {
  name: string;
  created_at?: string;
  updated_at?: string;
}

export interface Token {
  token_id: string;
  name: string;
  revoked: boolean;
  created_at: string;
  scope: string;
}

export interface WaterfallPhase {
  name: string;
  at: string;
  ms: number | null;
}

export interface Waterfall {
  phases: WaterfallPhase[];
  kind: string | null;
  estimate: Json | null;
}

export interface ChainNode {
  event: LevEvent;
  children: ChainNode[];
}

export interface Chain {
  roots: ChainNode[];
}

export interface Me {
  workspace: string;
  gateway_url?: string;
}

/** GET /api/overview (levers9.dashboard.views) */
export interface Free {
  cpu_millicores: number;
  memory_mib: number;
  gpus: number;
}

export interface OverviewPool {
  pool: string;
  workers: number;
  ready: number;
  free: Free;
  gpu_types: string[];
}

export interface OverviewWorker {
  worker_id: string;
  pool: string;
  status: string;
  cordoned: boolean;
  draining: boolean;
  gpu_type: string;
  gpu_count: number;
  cluster?: string;
  free: Free;
}

export interface OverviewFailure {
  seq: number;
  at: string;
  type: string;
  aggregate: string;
  aggregate_id: string;
  correlation_id: string;
  reason: string;
}

export interface Overview {
  workspace: string;
  deployments: { name: string; version: number; status: string; deployment_id: string; created_at: string;
    versions: { version: number; status: string; deployment_id: string }[] }[];
  containers: { by_state: Record<string, number>; live: number; total: number; ended: number };
  workers: OverviewWorker[];
  pools: OverviewPool[];
  failures: OverviewFailure[];
  failures_note?: string;
}

/** A row of GET /api/v1/tasks (gateway.tasks). */
export interface Task {
  task_id: string;
  deployment_id: string;
  queue: string;
  function: string;
  /** queued | running | retrying | succeeded | failed | expired | cancelled */
  status: string;
  attempt: number;
  reason: string;
  schedule_id?: string;
  tick?: string;
  enqueued_at: string;
  updated_at: string;
}

export interface TaskPage {
  tasks: Task[];
  total: number;
  limit: number;
  offset: number;
}

/** GET /api/v1/tasks/ID: the task as its events tell it. */
export interface TaskDetail {
  task_id: string;
  queue: string;
  function: string;
  status: string;
  attempt: number;
  retries: number;
  /** seconds since the epoch */
  enqueued_at: number;
  ttl: number;
  tick?: string;
  result?: unknown;
  output?: string;
  duration_ms?: number;
  error?: { outcome: string; type: string; reason: string; traceback: string };
}

export interface Schedule {
  name: string;
  deployment_id: string;
  cron: string;
  timezone: string;
  catch_up: boolean;
  next_runs: string[];
  last_tick: string;
  last_task_id: string;
}
