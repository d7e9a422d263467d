import os

from django.core.wsgi import get_wsgi_application

from portal.secret_key import refuse_to_serve_with_a_weak_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()
refuse_to_serve_with_a_weak_key()
