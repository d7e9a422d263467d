from django.apps import AppConfig


class WhatIfConfig(AppConfig):
    name = "scheduling.whatif"
    label = "whatif"
    verbose_name = "What-if replays of the quota tree"
