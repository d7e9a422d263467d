"""Single sign-on with OpenID Connect: discovery, the code flow with PKCE, groups mapped to memberships."""
