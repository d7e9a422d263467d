"""What the API does around a translation: the request's defaults (?team=, ?name=), what is still missing
said in the file's own terms, and the API's field errors said with the place in the file they came from."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from scheduling.jobfiles.common import Translation


def apply_defaults(translation: Translation, *, team: str | None, name: str | None, only_team: Callable[[], str | None]) -> None:
    """The request's defaults (``?team=``, ``?name=``, the user's only team) where the file gave none."""
    if "team" not in translation.fields:
        chosen = team or only_team()
        if chosen:
            translation.set("team", chosen, "?team=" if team else "your only team")
    if name and ("name" not in translation.fields or translation.origin.get("name", "").startswith("sbatch's name")):
        translation.set("name", name, "?name=")


_HOW_TO_NAME_TEAM = {
    "yardmaster": "give team: in the file",
    "pytorchjob": "give the yardmaster.io/team label or annotation",
    "mpijob": "give the yardmaster.io/team label or annotation",
    "slurm": "give #SBATCH --account=TEAM",
}
_HOW_TO_NAME_JOB = {
    "yardmaster": "give name: in the file",
    "pytorchjob": "give metadata.name",
    "mpijob": "give metadata.name",
    "slurm": "give #SBATCH --job-name=NAME",
}


def missing_hints(translation: Translation) -> dict[str, list[str]]:
    """What the API's validation would call "required", said in the file's own terms."""
    hints: dict[str, list[str]] = {}
    if "team" not in translation.fields:
        hints["team"] = [f"Which team runs this job? {_HOW_TO_NAME_TEAM[translation.source]} (or pass ?team=)"]
    if "name" not in translation.fields:
        hints["name"] = [f"Name the job: {_HOW_TO_NAME_JOB[translation.source]} (or pass ?name=)"]
    return hints


def located(errors: Mapping[str, Any], translation: Translation) -> dict[str, list[str]]:
    """The API's field errors on a translated job, each said with the place in the file the field came from."""
    out: dict[str, list[str]] = {}
    for key, messages in errors.items():
        items = messages if isinstance(messages, list) else [messages]
        origin = translation.origin.get(str(key))
        flat = [str(m) if not isinstance(m, Mapping) else "; ".join(f"{k}: {v}" for k, v in m.items()) for m in items]
        out[str(key)] = [f"{m} (from {origin})" if origin and origin != key else m for m in flat]
    return out
