"""The memory report as a table: live, reserved and tracked bytes per tag,
kept apart (a freed block is not released memory; released memory is not
free device memory)."""

from __future__ import annotations

from typing import Any, Dict, Mapping

MiB = 1 << 20


def tag_usage(report: Mapping[str, Any], tag: str) -> Dict[str, Any]:
    """The entry of `tag` in a report, or zeroes when the tag holds nothing."""
    for t in report.get("tags", []):
        if t["tag"] == tag:
            return dict(t)
    zero = {k: 0 for k in ("live_bytes", "reserved_bytes", "tracked_bytes", "segments",
                           "offloaded_bytes", "discarded_bytes", "reloadable_bytes",
                           "host_backup_bytes")}
    return {"tag": tag, "asleep": False, **zero}


def table(report: Mapping[str, Any]) -> str:
    """`report` (from ``Pool.report()``) as a fixed-width table."""

    def mib(b: int) -> str:
        return f"{b / MiB:.1f} MiB"

    cols = ("live_bytes", "reserved_bytes", "tracked_bytes", "host_backup_bytes")
    head = f"{'tag':<16}{'state':>9}{'live':>14}{'reserved':>14}{'tracked':>14}{'host backup':>14}{'segments':>10}"
    lines = [head]
    for t in list(report.get("tags", [])) + [report["total"]]:
        state = "asleep" if t.get("asleep") else "awake"
        lines.append(
            f"{t['tag']:<16}{state:>9}" + "".join(f"{mib(t[c]):>14}" for c in cols) + f"{t['segments']:>10}"
        )
    used, total = report.get("device_used_bytes"), report.get("device_total_bytes")
    if used is None or total is None:
        lines.append(f"device ({report.get('device', '?')}): used unknown")
    else:
        lines.append(f"device ({report.get('device', '?')}): {mib(used)} used of {mib(total)}")
    return "\n".join(lines)
