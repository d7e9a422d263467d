"""ASGI: the dev-session tunnel (/dev-sessions/<id>/ssh, websockets: SSH for `yard ssh`), the service proxy
(/services/<team>/<name>/…, HTTP) and the notebook proxy (/notebooks/<id>/lab/, HTTP and websockets) in
front of Django's ASGI handler.

Served by uvicorn (`make run` starts it beside gunicorn: portal/devserver.py); deployments route the
notebook, service and dev-session paths to it (README, "Notebooks through the portal"; docs/services.md;
docs/dev-sessions.md). Any other path is Django's.
"""

import os

from django.core.asgi import get_asgi_application

from portal.secret_key import refuse_to_serve_with_a_weak_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_application = get_asgi_application()

from portal.dev_proxy import DevProxy  # noqa: E402  (after Django is set up)
from portal.notebook_proxy import NotebookProxy  # noqa: E402
from portal.service_proxy import ServiceProxy  # noqa: E402

# The dev tunnel sits next to Django (its path is no other proxy's, so the order is only who looks first).
application = ServiceProxy(NotebookProxy(DevProxy(django_application)))  # type: ignore[arg-type]  # Django's ASGI types are narrower
refuse_to_serve_with_a_weak_key()
