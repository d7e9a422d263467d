"""SSH keys: the signed-in person's public keys, which their dev sessions' sshd lets in (docs/dev-sessions.md).

Only one's own keys are listed or removed here (another person's key is a 404, as a missing one).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from portal.forms import SshKeyForm
from portal.views.common import add_service_errors, signed_in
from tenants.selectors import access_ssh_key, ssh_keys_of
from tenants.services import ssh_key_add, ssh_key_delete


@login_required
@require_http_methods(["GET", "POST"])
def ssh_keys(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            ssh_key_add(user=user, name=form.cleaned_data["name"], public_key=form.cleaned_data["public_key"])
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            return redirect("ssh-keys")
    status = 400 if request.method == "POST" else 200
    return render(request, "portal/ssh_keys.html", {"form": form, "keys": ssh_keys_of(user=user)}, status=status)


@login_required
@require_POST
def ssh_key_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    user = signed_in(request)
    ssh_key_delete(user=user, key=access_ssh_key(user=user, pk=pk))
    return redirect("ssh-keys")
