//! Why walpost refuses to start its admin listener (`[admin]`, docs/control-plane.md).

/// The page the refusals point to.
pub const CONTROL_PLANE: &str = "docs/control-plane.md";

/// `[admin] addr` without a tokens file.
pub fn addr_without_tokens(addr: &str) -> String {
    format!(
        "[admin] addr = {addr} needs [admin] tokens_file (--admin-tokens-file, WALPOST_ADMIN_TOKENS_FILE): the admin API answers only requests with a token listed there, and walpost does not serve it without one; make a tokens file (one line NAME ROLE SHA256, see {CONTROL_PLANE}) or remove addr"
    )
}

/// A non-loopback `[admin] addr` without TLS.
pub fn plaintext_off_loopback(addr: &str) -> String {
    format!(
        "[admin] addr = {addr} is not a loopback address and [admin] has no tls_cert: tokens would cross the network in clear; set tls_cert and tls_key, listen on 127.0.0.1 or ::1 (behind a TLS proxy), or set [admin] allow_plaintext = true if the network itself is encrypted (see {CONTROL_PLANE})"
    )
}

/// One of `tls_cert` / `tls_key` without the other (`given`, `missing`).
pub fn tls_half(given: &str, missing: &str) -> String {
    format!("[admin] {given} is set without [admin] {missing}: TLS needs both the certificate chain and its private key (PEM files)")
}

/// The tokens file cannot be used (`error` names the line and what is wrong, never a hash).
pub fn tokens_unusable(error: &str) -> String {
    format!("the admin API cannot start: {error} (see {CONTROL_PLANE})")
}
