//! Telemetry for `capgate serve` (docs/service.md): `tracing` logs on standard error, human or
//! JSON; with `--otlp-endpoint`, OpenTelemetry traces and metrics over OTLP/gRPC; with
//! `--metrics-listen`, the same metrics as Prometheus text. docs/operations.md ("Telemetry")
//! lists every span and metric; docs/decisions/0010-telemetry.md says why it is built this way.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | start-up (resource, exporters, the subscriber) and the flush at shutdown |
//! | `rpc.rs` | the tower layer that makes one span per capgate RPC, and what handlers record on it |
//! | `metrics.rs` | every instrument, by name |
//! | `prometheus.rs` | `GET /metrics` |
//! | `throttle.rs` | log lines an outage would repeat, written at most once per interval |
//!
//! INVARIANT: no token, credential, secret reference or tool argument is recorded: span fields
//! and metric attributes are ids, outcomes, codes, revisions, versions and counts, and log lines
//! keep the rule they always had (docs/ARCHITECTURE.md, "telemetry").

pub mod metrics;
pub mod prometheus;
pub mod rpc;
pub mod throttle;

use std::net::SocketAddr;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tonic::codegen::http;
use tonic::transport::{Certificate, ClientTlsConfig};

pub use metrics::{metrics, AuditPath, CallResult};
pub use rpc::RpcLayer;
pub use throttle::Throttle;

use self::prometheus::MetricsServer;

/// How long each exporter may take to send what it holds at shutdown (the Kubernetes grace
/// period counts on it: deploy/kubernetes/deployment.yaml).
const FLUSH_WITHIN: Duration = Duration::from_secs(5);

/// `human` or `json` log lines on standard error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// What `serve` asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub log_format: LogFormat,
    /// `http://…` or `https://…`, checked by [`parse_otlp_endpoint`].
    pub otlp_endpoint: Option<String>,
    /// The CA (PEM) that signs an `https://` collector's certificate.
    pub otlp_ca: Option<Vec<u8>>,
    /// How often metrics are exported, and the longest a finished span waits to be sent.
    pub otlp_interval: Duration,
    pub metrics_listen: Option<SocketAddr>,
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A configuration that cannot work (exit 2).
    #[error("{0}")]
    Config(String),
    /// `--metrics-listen` could not be bound.
    #[error("cannot listen on `{addr}` for metrics: {error}")]
    Bind { addr: SocketAddr, error: std::io::Error },
}

/// `--otlp-endpoint`: an `http://` or `https://` URL with a host, and no credentials in it (they
/// would be logged with it; a collector's headers go in `OTEL_EXPORTER_OTLP_HEADERS`).
pub fn parse_otlp_endpoint(text: &str) -> Result<String, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| "expected a URL such as `http://127.0.0.1:4317`".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("expected an `http://` or `https://` URL, such as `http://127.0.0.1:4317`".to_owned());
    }
    let Some(authority) = uri.authority() else {
        return Err("expected a host, as in `http://127.0.0.1:4317`".to_owned());
    };
    if authority.as_str().contains('@') {
        return Err(
            "credentials do not belong in the URL: give the collector's headers in \
             `OTEL_EXPORTER_OTLP_HEADERS`"
                .to_owned(),
        );
    }
    Ok(text.to_owned())
}

/// What is running: the providers to flush at shutdown and the metrics endpoint.
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
    metrics_server: Option<MetricsServer>,
}

impl Telemetry {
    /// Installs the log subscriber and, as asked, the OTLP exporters and the metrics endpoint.
    /// Runs inside the runtime: the exporters' gRPC channel and the listener live on it.
    pub async fn start(options: &Options) -> Result<Telemetry, TelemetryError> {
        let instance = uuid::Uuid::now_v7().to_string();
        let resource = resource(&instance);

        let mut tracer = None;
        let mut meter = None::<opentelemetry_sdk::metrics::MeterProviderBuilder>;
        if let Some(endpoint) = &options.otlp_endpoint {
            let tls = tls(endpoint, options.otlp_ca.as_deref())?;
            let config = |error: opentelemetry_otlp::ExporterBuildError| {
                TelemetryError::Config(format!("`--otlp-endpoint`: {error}"))
            };
            let mut spans = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone());
            if let Some(tls) = &tls {
                spans = spans.with_tls_config(tls.clone());
            }
            let spans = spans.build().map_err(config)?;
            let mut points = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone());
            if let Some(tls) = tls {
                points = points.with_tls_config(tls);
            }
            let points = points.build().map_err(config)?;
            let batches = BatchConfigBuilder::default()
                .with_scheduled_delay(options.otlp_interval)
                .build();
            tracer = Some(
                SdkTracerProvider::builder()
                    .with_resource(resource.clone())
                    .with_span_processor(
                        BatchSpanProcessor::builder(spans)
                            .with_batch_config(batches)
                            .build(),
                    )
                    .build(),
            );
            meter = Some(
                SdkMeterProvider::builder()
                    .with_resource(resource.clone())
                    .with_reader(
                        PeriodicReader::builder(points)
                            .with_interval(options.otlp_interval)
                            .build(),
                    ),
            );
        }

        let mut registry = None;
        if options.metrics_listen.is_some() {
            let scraped = ::prometheus::Registry::new();
            let reader = opentelemetry_prometheus::exporter()
                .with_registry(scraped.clone())
                .build()
                .map_err(|error| TelemetryError::Config(format!("`--metrics-listen`: {error}")))?;
            meter = Some(
                meter
                    .unwrap_or_else(|| SdkMeterProvider::builder().with_resource(resource.clone()))
                    .with_reader(reader),
            );
            registry = Some(scraped);
        }
        let meter = meter.map(opentelemetry_sdk::metrics::MeterProviderBuilder::build);
        if let Some(meter) = &meter {
            opentelemetry::global::set_meter_provider(meter.clone());
        }

        let metrics_server = match (options.metrics_listen, registry) {
            (Some(addr), Some(registry)) => Some(
                MetricsServer::start(addr, registry)
                    .await
                    .map_err(|error| TelemetryError::Bind { addr, error })?,
            ),
            _ => None,
        };

        init_logging(
            options.log_format,
            tracer.as_ref().map(|provider| provider.tracer("capgate")),
        );
        if let Some(endpoint) = &options.otlp_endpoint {
            tracing::info!(
                endpoint = %endpoint,
                interval_ms = u64::try_from(options.otlp_interval.as_millis()).unwrap_or(u64::MAX),
                service.instance.id = %instance,
                "exporting traces and metrics over OTLP"
            );
        }
        if let Some(server) = &metrics_server {
            tracing::info!(address = %server.addr, "serving Prometheus metrics at /metrics");
        }
        Ok(Telemetry {
            tracer,
            meter,
            metrics_server,
        })
    }

    /// Where `--metrics-listen` listens, port resolved.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(|server| server.addr)
    }

    /// Stops the metrics endpoint and sends what the exporters hold: the last spans and a final
    /// collection of every metric. Call it after the server drained, so the final audit commits
    /// are counted.
    pub async fn shutdown(self) {
        let Telemetry {
            tracer,
            meter,
            metrics_server,
        } = self;
        if let Some(server) = metrics_server {
            server.stop();
        }
        if tracer.is_none() && meter.is_none() {
            return;
        }
        // The SDK's shutdown blocks until its export threads are done; those threads send over
        // the runtime's gRPC channel, so the waiting happens off the runtime's workers.
        let flushed = tokio::task::spawn_blocking(move || {
            let spans = tracer.map(|provider| provider.shutdown_with_timeout(FLUSH_WITHIN));
            let metrics = meter.map(|provider| provider.shutdown_with_timeout(FLUSH_WITHIN));
            (spans, metrics)
        });
        match tokio::time::timeout(FLUSH_WITHIN * 2, flushed).await {
            Ok(Ok((spans, metrics))) => {
                for (what, result) in [("spans", spans), ("metrics", metrics)] {
                    match result {
                        Some(Err(error)) => tracing::warn!(%error, "the last {what} could not be exported"),
                        Some(Ok(())) => tracing::info!("{what} exporter shut down"),
                        None => {}
                    }
                }
            }
            Ok(Err(_)) | Err(_) => tracing::warn!("telemetry did not flush in time"),
        }
    }
}

/// The resource every span and metric carries.
fn resource(instance: &str) -> Resource {
    Resource::builder()
        .with_service_name("capgate")
        .with_attributes([
            KeyValue::new("service.instance.id", instance.to_owned()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ])
        .build()
}

/// TLS for an `https://` collector: only with the CA that signs its certificate (this build
/// reads no system trust store, like the command-line clients).
fn tls(endpoint: &str, ca: Option<&[u8]>) -> Result<Option<ClientTlsConfig>, TelemetryError> {
    let https = endpoint.starts_with("https://");
    match (https, ca) {
        (true, Some(ca)) => Ok(Some(
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
        )),
        (true, None) => Err(TelemetryError::Config(
            "an `https://` `--otlp-endpoint` needs `--otlp-ca`, the CA that signs the collector's \
             certificate"
                .to_owned(),
        )),
        (false, Some(_)) => Err(TelemetryError::Config(
            "`--otlp-ca` is for an `https://` `--otlp-endpoint`".to_owned(),
        )),
        (false, None) => Ok(None),
    }
}

/// Logs on standard error, filtered by `CAPGATE_LOG`; with a tracer, capgate's spans (and the
/// events inside them) go to OpenTelemetry too, whatever `CAPGATE_LOG` says.
fn init_logging(format: LogFormat, tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    use tracing_subscriber::filter::{EnvFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = EnvFilter::try_from_env("CAPGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(terminal)
        .with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Human => lines.boxed(),
        LogFormat::Json => lines.json().boxed(),
    };
    // Only capgate's own spans: not the exporter's gRPC client, which would trace itself.
    let traces = tracer.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // The span's own fields are what it says; where in the code it was made, on which
            // thread, and how long it was polled are noise to an operator.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target("capgate", tracing::Level::INFO))
    });
    // A subscriber set already (a test harness) stays.
    let _ = tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(traces)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_endpoints_are_urls_without_credentials() {
        assert!(parse_otlp_endpoint("http://127.0.0.1:4317").is_ok());
        assert!(parse_otlp_endpoint("https://collector.internal:4317").is_ok());
        assert!(parse_otlp_endpoint("127.0.0.1:4317").is_err());
        assert!(parse_otlp_endpoint("ftp://collector:4317").is_err());
        assert!(parse_otlp_endpoint("http://user:secret@collector:4317").is_err());
        assert!(parse_otlp_endpoint("http://").is_err());
    }

    #[test]
    fn https_needs_a_ca_and_a_ca_needs_https() {
        assert!(tls("http://127.0.0.1:4317", None).is_ok_and(|tls| tls.is_none()));
        assert!(tls("https://collector:4317", None).is_err());
        assert!(tls("http://127.0.0.1:4317", Some(b"pem")).is_err());
    }
}
