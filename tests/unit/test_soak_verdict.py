"""bench/soak.py's verdict on RSS: growth past the tolerance that goes on over the second half fails;
a plateau within noise does not; nats-server is judged less what the log's new subjects explain."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from soak import MIB, NOISE, SUBJECT_BYTES, SUBJECTS, Sample, rss_problems  # noqa: E402


def samples(key: str, mibs: list[float], subjects: list[int] | None = None) -> list[Sample]:
    subjects = subjects or [0] * len(mibs)
    return [Sample(str(i), float(i), {SUBJECTS: n}, {key: (int(m * MIB), 0)}) for i, (m, n) in
            enumerate(zip(mibs, subjects, strict=True))]


def test_a_process_that_keeps_growing_fails_and_one_that_levelled_off_passes():
    assert rss_problems(samples("gateway [1]", [100, 110, 120, 130, 140]), 10, 8)
    assert not rss_problems(samples("gateway [1]", [100, 104, 106, 107, 107.5]), 10, 8)  # within tolerance
    # grew a lot early, then flat within noise: the soak of 4 December's S3 server (168 -> 233.3 -> 233.4)
    assert not rss_problems(samples("s3 (weed) [2]", [168.4, 201.5, 233.3, 233.4, 233.4]), 10, 8)
    assert rss_problems(samples("s3 (weed) [2]", [168.4, 201.5, 233.3, 233.4, 233.3 + 2 * NOISE / MIB]), 10, 8)


def test_nats_server_is_judged_less_what_its_new_subjects_explain():
    grown = [29.3, 33.1, 41.2, 42.5, 43.2]
    assert rss_problems(samples("nats [3]", grown), 10, 8)  # no new subjects: a leak
    n = int(14 * MIB / SUBJECT_BYTES)
    explained = samples("nats [3]", grown, [0, n // 4, n // 2, 3 * n // 4, n])
    assert not rss_problems(explained, 10, 8)
    assert not rss_problems(samples("gateway [1]", [100, 100, 100, 100, 100], [0, 0, 0, 0, n]), 10, 8)
    # the allowance is for nats-server only: another process growing alongside still fails
    assert rss_problems(samples("gateway [1]", grown, [0, n // 4, n // 2, 3 * n // 4, n]), 10, 8)
