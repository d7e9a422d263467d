"""Serializers whose fields are built once per class (scheduling/api/serializers.py uses it for the job
answers and the submission's body): a CI burst submits hundreds of jobs a second, and DRF builds and
binds every field of a serializer at every instance."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject


class FieldsBuiltOnce:
    """A serializer whose fields are built once per class, not once per request: DRF builds a
    ModelSerializer's fields from the model's options at every instance, and deep-copies a plain one's
    declared fields (together 2 ms of a 10 ms job submission). Each instance gets shallow copies of the
    built, unbound fields, which it binds to itself as DRF binds its own, so no two instances (or
    threads) share a bound field. What the copies do share is read-only once built: their validators and
    messages, and a nested list's or dict's child, which is why only serializers whose nested lists and
    dicts read no context take this."""

    def get_fields(self) -> dict[str, Any]:
        cls = type(self)
        built: dict[str, Any] | None = cls.__dict__.get("_fields_built")
        if built is None:
            built = super().get_fields()  # type: ignore[misc]
            cls._fields_built = built  # type: ignore[attr-defined]
        return {name: _unbound_copy(field) for name, field in built.items()}

    def to_representation(self, instance: Any) -> dict[str, Any]:
        """DRF's Serializer.to_representation, without a bound copy per field per answer for the plain ones:
        a field of one of _PLAIN's exact classes reads its value (its source, from the instance) and turns
        it into JSON without a look at its parent or the context, so one bound once per class answers for
        every instance and thread. The others (method fields, nested serializers) are bound per instance,
        as DRF binds them. Binding a job answer's fields was a tenth of a submission's web CPU;
        tests/api/test_submission_fast_path.py holds the answers to DRF's own."""
        ret: dict[str, Any] = {}
        for name, field, plain in _plan(type(self)):
            if not plain:
                field = _unbound_copy(field)
                field.bind(name, self)
            try:
                attribute = field.get_attribute(instance)
            except SkipField:
                continue
            check_for_none = attribute.pk if isinstance(attribute, PKOnlyObject) else attribute
            ret[name] = None if check_for_none is None else field.to_representation(attribute)
        return ret


# Field classes whose get_attribute and to_representation read only the instance and their own
# settings (never their parent, the root or the context): DRF's own, by exact class.
_PLAIN: frozenset[type] = frozenset(
    {
        serializers.BooleanField, serializers.CharField, serializers.ChoiceField, serializers.DateTimeField,
        serializers.FloatField, serializers.IntegerField, serializers.JSONField, serializers.ReadOnlyField,
        # A ModelSerializer's field for a BigAutoField (DRF 3.15+; its type stubs do not know it yet).
        getattr(serializers, "BigIntegerField", serializers.IntegerField),
    }
)  # fmt: skip


def _plan(cls: Any) -> list[tuple[str, Any, bool]]:
    """A FieldsBuiltOnce class's readable fields in order: (name, field, plain). A plain one (_PLAIN) is
    bound once, for every instance; the others are left unbound, for a copy bound per instance."""
    plan: list[tuple[str, Any, bool]] | None = cls.__dict__.get("_plan")
    if plan is None:
        template = cls.__new__(cls)  # what the shared fields are bound to: only their error messages read it
        template.parent = None
        plan = []
        for name, field in template.get_fields().items():
            if field.write_only:
                continue
            plain = type(field) in _PLAIN
            if plain:
                field.bind(name, template)
            plan.append((name, field, plain))
        cls._plan = plan
    return plan


def _unbound_copy(field: Any) -> Any:
    copy = object.__new__(type(field))
    copy.__dict__.update(field.__dict__)
    return copy
