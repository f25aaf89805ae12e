//! Which authentication exchanges walpost takes part in: a pure policy over the
//! connection's protection, the server's request and the connection string.
//!
//! With `require_auth` given, libpq's rules decide alone: a positive list names the
//! methods the server must use (`none`: no exchange at all), a `!` list the ones it must
//! not use.
//!
//! Without `require_auth`, walpost's default: a cleartext password
//! (AuthenticationCleartextPassword) or an MD5 response (AuthenticationMD5Password) is
//! sent only over a Unix-domain socket (local: the kernel names the peer) or over TLS
//! whose certificate chain was verified (`sslmode=verify-ca`/`verify-full`, or an
//! `sslrootcert` file with `require`/`prefer`). Over plain TCP or unverified TLS such a
//! request is refused before anything is sent, with the way to allow it. SCRAM-SHA-256
//! is always allowed (it never reveals the password), and so is no authentication.
//!
//! Always: a SCRAM exchange must end with the server's proof (SASLFinal) before
//! AuthenticationOk, and `channel_binding=require` accepts nothing but a completed
//! SCRAM-SHA-256-PLUS over TLS.

use postgres_protocol::authentication::sasl::ChannelBinding as ScramBinding;

use crate::config::{AuthMethod, ChannelBinding, Config};
use crate::error::Error;

/// What protects the bytes of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// A Unix-domain socket.
    Local,
    /// Plain TCP because of `sslmode=disable`.
    PlainByConfig,
    /// Plain TCP because the server declined TLS (`sslmode=prefer`).
    PlainServerDeclinedTls,
    /// TLS without a certificate check.
    TlsUnverified,
    /// TLS with the certificate chain checked.
    TlsVerified,
}

impl Channel {
    pub(crate) fn is_tls(self) -> bool {
        matches!(self, Channel::TlsUnverified | Channel::TlsVerified)
    }

    fn describe(self, config: &Config) -> String {
        let mode = config.sslmode.as_str();
        match self {
            Channel::Local => "a Unix-domain socket".into(),
            Channel::PlainByConfig => "a connection without TLS (sslmode=disable)".into(),
            Channel::PlainServerDeclinedTls => {
                format!("a connection without TLS (sslmode={mode}, and the server declined TLS)")
            }
            Channel::TlsUnverified => {
                format!("TLS whose certificate is not verified (sslmode={mode} without an sslrootcert file)")
            }
            Channel::TlsVerified => format!("TLS with a verified certificate (sslmode={mode})"),
        }
    }
}

/// An authentication request walpost can be asked to take part in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Cleartext,
    Md5,
    Sasl,
    Gss,
    Sspi,
}

impl Request {
    fn method(self) -> AuthMethod {
        match self {
            Request::Cleartext => AuthMethod::Password,
            Request::Md5 => AuthMethod::Md5,
            Request::Sasl => AuthMethod::ScramSha256,
            Request::Gss => AuthMethod::Gss,
            Request::Sspi => AuthMethod::Sspi,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Request::Cleartext => "a cleartext password (AuthenticationCleartextPassword)",
            Request::Md5 => "an MD5 password hash (AuthenticationMD5Password)",
            Request::Sasl => "SASL (SCRAM-SHA-256)",
            Request::Gss => "GSSAPI",
            Request::Sspi => "SSPI",
        }
    }
}

/// The exchange done when AuthenticationOk arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completed {
    Nothing,
    Password,
    Md5,
    /// SCRAM started; `plus`: with channel binding.
    ScramUnfinished {
        plus: bool,
    },
    Scram {
        plus: bool,
    },
}

fn refused(host: &str, reason: String) -> Error {
    Error::AuthRefused { host: host.to_owned(), reason }
}

/// Whether walpost answers the server's `request` on `channel`. Nothing secret has been
/// sent when this refuses.
pub(crate) fn check_request(config: &Config, host: &str, channel: Channel, request: Request) -> Result<(), Error> {
    if config.channel_binding == ChannelBinding::Require && request != Request::Sasl {
        return Err(refused(
            host,
            format!(
                "the server asks for {}, and channel_binding=require accepts only SCRAM-SHA-256-PLUS over TLS",
                request.describe()
            ),
        ));
    }
    match &config.require_auth {
        Some(rule) if !rule.allows(request.method()) => {
            Err(refused(host, format!("the server asks for {}, which {rule} does not allow", request.describe())))
        }
        Some(_) => Ok(()),
        None if matches!(request, Request::Cleartext | Request::Md5)
            && !matches!(channel, Channel::Local | Channel::TlsVerified) =>
        {
            let allow = if request == Request::Cleartext { "password" } else { "md5" };
            Err(refused(
                host,
                format!(
                    "the server asks for {} over {}, where anyone on the network path could take it; it was not sent. \
                     Use TLS with a verified certificate (sslmode=verify-full and sslrootcert=<CA file>), have the server use scram-sha-256, \
                     or allow it explicitly with require_auth={allow} in the connection string (or PGREQUIREAUTH={allow})",
                    request.describe(),
                    channel.describe(config)
                ),
            ))
        }
        None => Ok(()),
    }
}

/// The SCRAM mechanism and channel binding to use, given what the server offers.
/// `end_point`: the TLS server certificate's tls-server-end-point hash, when TLS.
pub(crate) fn choose_scram(
    config: &Config,
    host: &str,
    channel: Channel,
    end_point: Option<&[u8]>,
    offers_plus: bool,
    offers_plain: bool,
) -> Result<(&'static str, ScramBinding), Error> {
    let plus = |ep: &[u8]| ("SCRAM-SHA-256-PLUS", ScramBinding::tls_server_end_point(ep.to_vec()));
    let no_mechanism = || {
        Error::auth(format!(
            "the server at {host} offers no SASL mechanism walpost supports (SCRAM-SHA-256{})",
            if config.channel_binding == ChannelBinding::Disable {
                " without channel binding: channel_binding=disable"
            } else {
                ""
            }
        ))
    };
    match config.channel_binding {
        ChannelBinding::Require => match end_point {
            Some(ep) if offers_plus => Ok(plus(ep)),
            Some(_) => Err(refused(
                host,
                "channel_binding=require, and the server does not offer SCRAM-SHA-256-PLUS (or its certificate's signature hash is unknown)".into(),
            )),
            None => Err(refused(
                host,
                format!("channel_binding=require needs TLS, and this is {}", channel.describe(config)),
            )),
        },
        ChannelBinding::Prefer => match end_point {
            Some(ep) if offers_plus => Ok(plus(ep)),
            _ if !offers_plain => Err(no_mechanism()),
            // Over TLS without binding, say so ('y') so that a stripped -PLUS is detected.
            _ if channel.is_tls() => Ok(("SCRAM-SHA-256", ScramBinding::unrequested())),
            _ => Ok(("SCRAM-SHA-256", ScramBinding::unsupported())),
        },
        ChannelBinding::Disable if offers_plain => Ok(("SCRAM-SHA-256", ScramBinding::unsupported())),
        ChannelBinding::Disable => Err(no_mechanism()),
    }
}

/// Whether AuthenticationOk after `completed` is acceptable.
pub(crate) fn check_ok(config: &Config, host: &str, completed: Completed) -> Result<(), Error> {
    if let Completed::ScramUnfinished { .. } = completed {
        return Err(refused(
            host,
            "the server ended SCRAM authentication without proving it knows the password (AuthenticationOk before SASLFinal)"
                .into(),
        ));
    }
    if config.channel_binding == ChannelBinding::Require && completed != (Completed::Scram { plus: true }) {
        return Err(refused(
            host,
            "channel_binding=require, and the server let walpost in without SCRAM-SHA-256-PLUS".into(),
        ));
    }
    match &config.require_auth {
        Some(rule) if completed == Completed::Nothing && !rule.allows(AuthMethod::None) => {
            Err(refused(host, format!("the server did not ask for any authentication, which {rule} does not allow")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse_with_env(text, &|_| None).unwrap()
    }

    const ALL: [Channel; 5] = [
        Channel::Local,
        Channel::PlainByConfig,
        Channel::PlainServerDeclinedTls,
        Channel::TlsUnverified,
        Channel::TlsVerified,
    ];

    fn allowed(text: &str, channel: Channel, request: Request) -> bool {
        check_request(&config(text), "h:5432", channel, request).is_ok()
    }

    #[test]
    fn default_policy_sends_passwords_only_to_verified_or_local_servers() {
        let base = "host=h user=u";
        for channel in ALL {
            let safe = matches!(channel, Channel::Local | Channel::TlsVerified);
            assert_eq!(allowed(base, channel, Request::Cleartext), safe, "{channel:?}");
            assert_eq!(allowed(base, channel, Request::Md5), safe, "{channel:?}");
            assert!(allowed(base, channel, Request::Sasl), "{channel:?}");
            assert!(check_ok(&config(base), "h", Completed::Nothing).is_ok());
        }
        let e = check_request(&config(base), "h:5432", Channel::PlainServerDeclinedTls, Request::Cleartext)
            .unwrap_err()
            .to_string();
        assert!(e.contains("h:5432") && e.contains("cleartext password") && e.contains("server declined TLS"), "{e}");
        assert!(e.contains("require_auth=password") && e.contains("verify-full"), "{e}");
        let e = check_request(&config(base), "h", Channel::TlsUnverified, Request::Md5).unwrap_err().to_string();
        assert!(e.contains("require_auth=md5") && e.contains("not verified"), "{e}");
        assert!(!check_request(&config(base), "h", Channel::TlsUnverified, Request::Md5).unwrap_err().is_transient());
    }

    #[test]
    fn require_auth_decides_alone_when_given() {
        for channel in ALL {
            assert!(allowed("host=h user=u require_auth=password", channel, Request::Cleartext));
            assert!(!allowed("host=h user=u require_auth=password", channel, Request::Md5));
            assert!(!allowed("host=h user=u require_auth=password", channel, Request::Sasl));
            assert!(allowed("host=h user=u require_auth=!password", channel, Request::Md5));
            assert!(!allowed("host=h user=u require_auth=!password", channel, Request::Cleartext));
            assert!(!allowed("host=h user=u require_auth=scram-sha-256", channel, Request::Md5));
        }
        let c = config("host=h user=u require_auth=scram-sha-256");
        let e = check_ok(&c, "h", Completed::Nothing).unwrap_err().to_string();
        assert!(e.contains("did not ask for any authentication") && e.contains("require_auth=scram-sha-256"), "{e}");
        assert!(check_ok(&config("host=h user=u require_auth=none,scram-sha-256"), "h", Completed::Nothing).is_ok());
        assert!(check_ok(&config("host=h user=u require_auth=!none"), "h", Completed::Nothing).is_err());
        assert!(check_ok(&config("host=h user=u require_auth=!md5"), "h", Completed::Nothing).is_ok());
    }

    #[test]
    fn unfinished_scram_is_never_accepted() {
        for text in ["host=h user=u", "host=h user=u require_auth=none,scram-sha-256"] {
            let e = check_ok(&config(text), "h", Completed::ScramUnfinished { plus: false }).unwrap_err().to_string();
            assert!(e.contains("without proving"), "{e}");
        }
    }

    #[test]
    fn channel_binding() {
        let req = config("host=h user=u channel_binding=require");
        for request in [Request::Cleartext, Request::Md5, Request::Gss] {
            assert!(check_request(&req, "h", Channel::TlsVerified, request).is_err());
        }
        assert!(check_request(&req, "h", Channel::TlsVerified, Request::Sasl).is_ok());
        assert!(
            choose_scram(&req, "h", Channel::TlsVerified, Some(b"hash"), true, true).unwrap().0 == "SCRAM-SHA-256-PLUS"
        );
        assert!(choose_scram(&req, "h", Channel::TlsVerified, Some(b"hash"), false, true).is_err());
        let Err(e) = choose_scram(&req, "h", Channel::PlainServerDeclinedTls, None, true, true) else {
            panic!("channel_binding=require without TLS must be refused")
        };
        let e = e.to_string();
        assert!(e.contains("needs TLS"), "{e}");
        assert!(check_ok(&req, "h", Completed::Scram { plus: false }).is_err());
        assert!(check_ok(&req, "h", Completed::Nothing).is_err());
        assert!(check_ok(&req, "h", Completed::Scram { plus: true }).is_ok());

        let prefer = config("host=h user=u");
        assert_eq!(
            choose_scram(&prefer, "h", Channel::TlsUnverified, Some(b"x"), true, true).unwrap().0,
            "SCRAM-SHA-256-PLUS"
        );
        assert_eq!(
            choose_scram(&prefer, "h", Channel::TlsUnverified, Some(b"x"), false, true).unwrap().0,
            "SCRAM-SHA-256"
        );
        assert_eq!(choose_scram(&prefer, "h", Channel::PlainByConfig, None, true, true).unwrap().0, "SCRAM-SHA-256");
        assert!(choose_scram(&prefer, "h", Channel::PlainByConfig, None, true, false).is_err());
        let disable = config("host=h user=u channel_binding=disable");
        assert_eq!(
            choose_scram(&disable, "h", Channel::TlsVerified, Some(b"x"), true, true).unwrap().0,
            "SCRAM-SHA-256"
        );
    }
}
