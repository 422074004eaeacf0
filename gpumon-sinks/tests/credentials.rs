//! No configured credential is printed: every setting that holds one is a
//! [`Secret`](gpumon_sinks::Secret), whose `Debug` is `<redacted>` (a config, a sink or an error
//! logged with `{:?}`). Outside the crate, through the public API, as an embedder logs them.

/// The credential configured below: it must not appear in any `{:?}` that may reach a log.
const TOKEN: &str = "tok-7f3a9c";

/// Every setting that holds a credential, as `{:?}` shows it, in this build's features.
#[allow(unused_mut)] // with no sink feature, the list stays empty
fn configured_credentials() -> Vec<(&'static str, String)> {
    let mut shown = Vec::new();
    #[cfg(feature = "influxdb")]
    {
        use gpumon_sinks::influxdb::InfluxConfig;
        let mut c = InfluxConfig::default();
        c.password = Some(TOKEN.into());
        shown.push(("InfluxConfig.password", format!("{c:?}")));
        shown.push(("InfluxConfig.token", format!("{:?}", InfluxConfig::v2("http://h", "o", "b", TOKEN))));
    }
    #[cfg(feature = "remote-write")]
    {
        use gpumon_sinks::remote_write::RemoteWriteConfig;
        let mut c = RemoteWriteConfig::default();
        c.bearer_token = Some(TOKEN.into());
        shown.push(("RemoteWriteConfig.bearer_token", format!("{c:?}")));
        let mut c = RemoteWriteConfig::default();
        c.password = Some(TOKEN.into());
        shown.push(("RemoteWriteConfig.password", format!("{c:?}")));
        let mut c = RemoteWriteConfig::default();
        c.headers.insert("x-auth".into(), TOKEN.into());
        shown.push(("RemoteWriteConfig.headers", format!("{c:?}")));
    }
    #[cfg(feature = "pushgateway")]
    {
        use gpumon_sinks::prometheus::{PushgatewayConfig, PushgatewaySink};
        let mut c = PushgatewayConfig::default();
        c.password = Some(TOKEN.into());
        shown.push(("PushgatewayConfig.password", format!("{c:?}")));
        let b = PushgatewaySink::builder("http://127.0.0.1:9091").basic_auth("u", TOKEN);
        shown.push(("PushgatewaySinkBuilder", format!("{b:?}")));
    }
    #[cfg(feature = "otlp")]
    {
        let mut c = gpumon_sinks::otlp::OtlpConfig::default();
        c.headers.insert("authorization".into(), format!("Bearer {TOKEN}").into());
        shown.push(("OtlpConfig.headers", format!("{c:?}")));
    }
    #[cfg(feature = "prometheus")]
    {
        use gpumon_sinks::prometheus::{Auth, TenantConfig};
        let selector: gpumon_core::attribution::TenantSelector = "namespace=team-a".parse().unwrap();
        shown.push(("Auth::bearer", format!("{:?}", Auth::bearer(TOKEN))));
        shown.push(("Auth::basic", format!("{:?}", Auth::basic("ops", TOKEN))));
        shown.push(("TenantConfig::bearer", format!("{:?}", TenantConfig::bearer("a", TOKEN, selector.clone()))));
        shown.push(("TenantConfig::basic", format!("{:?}", TenantConfig::basic("a", "u", TOKEN, selector))));
    }
    shown
}

#[test]
fn no_configured_credential_is_printed() {
    for (what, debug) in configured_credentials() {
        assert!(!debug.contains(TOKEN), "{what} printed the credential: {debug}");
        assert!(debug.contains("<redacted>"), "{what} does not say a credential is set: {debug}");
    }
}
