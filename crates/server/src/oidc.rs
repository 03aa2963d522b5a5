//! OAuth 2.0 / OIDC bearer tokens: JWTs signed by a configured issuer, checked
//! against the issuer's key set (JWKS), the issuer and the audience. The tenant comes
//! from a claim (`tessera_tenant` by default); the role comes from the role binding of
//! the token's subject (`sub`) in that tenant, as for API keys.

use std::path::Path;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;

/// Who may issue tokens, for whom, and with which keys.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    pub issuer: String,
    pub audience: String,
    pub jwks: JwkSet,
    /// The claim that names the caller's tenant.
    pub tenant_claim: String,
}

#[derive(Debug, thiserror::Error)]
pub enum OidcConfigError {
    #[error("reading the JWKS file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the JWKS file {path} is not a JSON Web Key Set: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
}

impl OidcConfig {
    /// Loads the key set from a JWKS document (the issuer's `jwks_uri`, saved).
    pub fn from_jwks_file(
        issuer: &str,
        audience: &str,
        path: &Path,
    ) -> Result<Self, OidcConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| OidcConfigError::Read {
            path: p.clone(),
            source,
        })?;
        let jwks = serde_json::from_str(&text)
            .map_err(|source| OidcConfigError::Parse { path: p, source })?;
        Ok(OidcConfig {
            issuer: issuer.into(),
            audience: audience.into(),
            jwks,
            tenant_claim: "tessera_tenant".into(),
        })
    }

    /// Validates `token`; returns (tenant, subject). Any failure is `None`: the
    /// caller answers 401 without saying why.
    pub fn verify(&self, token: &str) -> Option<(String, String)> {
        let header = decode_header(token).ok()?;
        let jwk = match &header.kid {
            Some(kid) => self.jwks.find(kid)?,
            None if self.jwks.keys.len() == 1 => &self.jwks.keys[0],
            None => return None,
        };
        let key = DecodingKey::from_jwk(jwk).ok()?;
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        // A token not valid yet (`nbf` ahead) is refused, with the same leeway as `exp`.
        v.validate_nbf = true;
        #[derive(Deserialize)]
        struct Claims {
            sub: String,
            #[serde(flatten)]
            rest: serde_json::Map<String, serde_json::Value>,
        }
        let data = decode::<Claims>(token, &key, &v).ok()?;
        let tenant = data
            .claims
            .rest
            .get(&self.tenant_claim)?
            .as_str()?
            .to_string();
        Some((tenant, data.claims.sub))
    }
}
