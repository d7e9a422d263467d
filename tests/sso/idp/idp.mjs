// A real OpenID Connect provider for Yardmaster's SSO tests: panva's oidc-provider (OpenID Certified),
// on 127.0.0.1 only. The test starts it with:
//   IDP_PORT, IDP_CLIENT_ID, IDP_CLIENT_SECRET, IDP_REDIRECT_URI, IDP_ACCOUNTS (a JSON file)
// Accounts are read from IDP_ACCOUNTS at every sign-in, so a test can take a user out of a group
// between two sign-ins the way an administrator would in the real provider.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const env = (name) => {
  const value = process.env[name];
  if (!value) { console.error(`idp: ${name} must be set`); process.exit(2); }
  return value;
};

const port = Number(env('IDP_PORT'));
const issuer = `http://127.0.0.1:${port}`;
const accounts = () => JSON.parse(readFileSync(env('IDP_ACCOUNTS'), 'utf8'));

const configuration = {
  clients: [{
    client_id: env('IDP_CLIENT_ID'),
    client_secret: env('IDP_CLIENT_SECRET'),
    redirect_uris: [env('IDP_REDIRECT_URI')],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  // PKCE for every client, confidential ones too: a sign-in without a code_verifier must fail here.
  pkce: { required: () => true },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'given_name', 'family_name', 'preferred_username'],
    groups: ['groups'],
  },
  features: { devInteractions: { enabled: true } },
  cookies: { keys: ['yardmaster-test-idp-cookie-key-not-secret'] },
  async findAccount(ctx, id) {
    const account = accounts()[id];
    if (!account) return undefined;
    return {
      accountId: id,
      async claims() {
        // Re-read: the groups are what the provider says at this sign-in.
        const now = accounts()[id] || account;
        return { sub: id, preferred_username: id, email_verified: true, ...now };
      },
    };
  },
  // First-party client: no consent screen once signed in (as an enterprise IdP is set up for its own apps).
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
};

const provider = new Provider(issuer, configuration);
provider.on('server_error', (ctx, err) => console.error('idp server_error', err));
provider.on('grant.error', (ctx, err) => console.error('idp grant.error', err.message, err.error_description || ''));
provider.listen(port, '127.0.0.1', () => console.log(`idp ready ${issuer}`));
