"""Forms of the notifications pages: they parse input; services do the writes."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from notifications.kinds import CHOOSABLE, DEFAULTS, Channel, Kind
from tenants.models import OrgUnit

KIND_CHOICES = [(k.value, k.label) for k in CHOOSABLE]


class WebhookForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is, e.g. “#pretraining-alerts”")
    url = forms.URLField(
        max_length=1000,
        label="URL",
        assume_scheme="https",
        help_text="Slack, Mattermost or Teams incoming-webhook URL, or your own endpoint",
    )
    team = forms.ModelChoiceField(
        queryset=OrgUnit.objects.none(),
        required=False,
        empty_label="— personal (your own jobs) —",
        help_text="Pick a team you lead to hear about all of its jobs and its quota",
    )
    kinds = forms.MultipleChoiceField(
        choices=KIND_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        initial=sorted(DEFAULTS[Channel.WEBHOOK]),
        label="Events",
    )

    def __init__(self, *args: Any, led: QuerySet[OrgUnit], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team_field = self.fields["team"]
        assert isinstance(team_field, forms.ModelChoiceField)
        team_field.queryset = led


class WebhookKindsForm(forms.Form):
    kinds = forms.MultipleChoiceField(choices=KIND_CHOICES, widget=forms.CheckboxSelectMultiple, label="Events")


def preference_field_name(kind: str, channel: str) -> str:
    return f"{channel}__{kind}"


class PreferencesForm(forms.Form):
    """One checkbox per (kind, channel); unticked boxes are sent as absent, so every box is a choice."""

    def __init__(self, *args: Any, channels: list[str], initial_grid: dict[tuple[str, str], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.channels = channels
        for kind in CHOOSABLE:
            for channel in channels:
                name = preference_field_name(kind, channel)
                self.fields[name] = forms.BooleanField(
                    required=False, initial=initial_grid[(kind, channel)], label=f"{Kind(kind).label}: {Channel(channel).label}"
                )

    def rows(self) -> list[tuple[str, list[Any]]]:
        return [(Kind(k).label, [self[preference_field_name(k, c)] for c in self.channels]) for k in CHOOSABLE]

    def choices(self) -> dict[tuple[str, str], bool]:
        return {(k, c): bool(self.cleaned_data[preference_field_name(k, c)]) for k in CHOOSABLE for c in self.channels}
