"""yard quota and report: your teams' GPUs and standing, and the monthly usage report (sreport)."""

from __future__ import annotations

import sys

import click

from yardcli.commands.common import (
    _api,
    _print_json,
    _table,
    api_command,
    json_option,
    out,
)


@click.command()
@click.option("--team", help="Only this one of your teams")
@json_option
@api_command
def quota(team: str | None, as_json: bool) -> None:
    """Your teams' guaranteed GPUs, limits, GPUs in use and borrowed, and fair-share standing."""
    data = _api().get("/api/v1/me/quota", team=team)
    if as_json:
        _print_json(data)
        return
    rows = []
    for entry in data["teams"]:
        fs = entry.get("fair_share") or {}
        standing = f"{fs['rank']} of {fs['teams']}" if fs else ""
        for line in entry["quotas"] or [{"gpu_type": "", "guaranteed": "", "limit": "", "used": "", "borrowed": ""}]:
            usage = fs.get("usage_gpu_hours", {}).get(line["gpu_type"], 0.0) if fs else ""
            share = fs.get("usage_share", {}).get(line["gpu_type"]) if fs else None
            rows.append([
                entry["team"]["slug"], line["gpu_type"], line["guaranteed"],
                "none" if line["limit"] is None else line["limit"], line["used"], line["borrowed"],
                f"{usage:.1f}" if isinstance(usage, float) else usage, "" if share is None else f"{share:.0%}", standing,
            ])  # fmt: skip
    _table(["TEAM", "GPU", "GUARANTEED", "LIMIT", "IN USE", "BORROWED", "RECENT GPU-H", "SHARE", "FAIR-SHARE PLACE"], rows)
    out.print(
        f"Recent use decays with a half-life of {data['half_life_days']:g} days; place 1 is served first. "
        "Borrowed GPUs run beyond the guarantee and may be reclaimed."
    )


@click.command()
@click.option("--month", help="YYYY-MM (default: this month)")
@click.option("--unit", type=int, help="The top unit's id (default: every unit you may see)")
@click.option("--csv", "as_csv", is_flag=True, help="CSV, as the portal's download")
@json_option
@api_command
def report(month: str | None, unit: int | None, as_csv: bool, as_json: bool) -> None:
    """Monthly GPU usage by unit, like sreport: guaranteed, used and borrowed GPU-hours."""
    api = _api()
    params = {k: v for k, v in {"month": month, "unit": unit}.items() if v is not None}
    if as_csv:
        response = api.request("GET", "/api/v1/reports/usage", params={**params, "format": "csv"})
        sys.stdout.write(response.text)
        return
    data = api.get("/api/v1/reports/usage", **params)
    if as_json:
        _print_json(data)
        return
    rows = data.get("rows", [])
    columns = {"unit_path": "UNIT", "unit_kind": "KIND", "gpu_type": "GPU", "guaranteed_gpus": "GUARANTEED",
               "guaranteed_gpu_hours": "GUARANTEED GPU-H", "used_gpu_hours": "USED GPU-H", "borrowed_gpu_hours": "BORROWED GPU-H",
               "lost_to_preemption_gpu_hours": "LOST TO PREEMPTION", "idle_reaped_gpu_hours": "IDLE REAPED",
               "efficiency_ratio": "EFFICIENCY"}  # fmt: skip
    _table(list(columns.values()), [[row.get(c) for c in columns] for row in rows],
           title=f"GPU usage, {data['month']} ({data['time_zone']})")  # fmt: skip
    totals = data.get("totals", {})
    out.print(
        f"total: {totals.get('used_gpu_hours', 0):.1f} GPU-h used of {totals.get('guaranteed_gpu_hours', 0):.1f} guaranteed, "
        f"{totals.get('borrowed_gpu_hours', 0):.1f} borrowed"
    )
