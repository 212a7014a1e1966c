//! Logging and distributed tracing.
//!
//! Logs go to stdout as before. Traces are exported over OTLP/HTTP
//! (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and not at all otherwise:
//! then no OpenTelemetry layer is installed and spans cost what they cost
//! before. The SDK reads the other standard variables itself:
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`
//! (+ `_ARG`), `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_HEADERS`. An `https://`
//! endpoint is verified against the system's roots and, when
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (or `…_TRACES_CERTIFICATE`) names a PEM
//! file, its CA too; `OTEL_EXPORTER_OTLP_TIMEOUT` (ms) bounds each export.
//!
//! Trace context crosses processes as W3C Trace Context only (`traceparent`,
//! `tracestate`), whatever `OTEL_PROPAGATORS` says: it is stored on outbox
//! rows and in Kafka headers, which other relays (Debezium) read as W3C.

mod context;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::config::LogFormat;

pub use context::{TraceContext, continue_trace, link, outgoing, recorded, recording};

const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: only http/protobuf (port 4318) is built in"
    )]
    Protocol(String),
    #[error("cannot build the OTLP span exporter")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("{variable}: cannot read the CA certificate {path}")]
    Certificate {
        variable: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{variable}: {path} holds no PEM certificate reqwest accepts")]
    CertificatePem {
        variable: &'static str,
        path: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{variable}={value:?} is not a number of milliseconds")]
    Timeout {
        variable: &'static str,
        value: String,
    },
    #[error("cannot build the OTLP HTTP client")]
    Client(#[source] reqwest::Error),
    #[error("building the OTLP HTTP client panicked")]
    ClientPanicked,
}

/// Exports what is still buffered when dropped (or at [`Telemetry::shutdown`]).
#[derive(Debug)]
#[must_use = "dropping it at once stops the export of traces"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends the spans still buffered, waiting up to the exporter's timeout.
    pub fn shutdown(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "spans may be lost: the exporter did not shut down cleanly");
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.flush();
    }
}

/// An `OTEL_*` variable's value; empty counts as unset, as the
/// OpenTelemetry specification says.
fn variable(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// Whether the environment asks for traces to be exported.
fn endpoint_configured() -> bool {
    ENDPOINT_VARIABLES
        .iter()
        .any(|name| variable(name).is_some())
}

fn tracer_provider(service_name: &'static str) -> Result<SdkTracerProvider, TelemetryError> {
    if let Some(protocol) = variable("OTEL_EXPORTER_OTLP_PROTOCOL")
        && protocol != "http/protobuf"
    {
        return Err(TelemetryError::Protocol(protocol));
    }
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(http_client()?)
        .build()?;
    let mut resource = Resource::builder();
    // The variables win over the binary's own name.
    let named_by_environment = variable("OTEL_SERVICE_NAME").is_some()
        || variable("OTEL_RESOURCE_ATTRIBUTES")
            .is_some_and(|attributes| attributes.contains("service.name="));
    if !named_by_environment {
        resource = resource.with_service_name(service_name);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The first of `names` that is set, with its name.
fn first_variable(names: [&'static str; 2]) -> Option<(&'static str, String)> {
    names
        .into_iter()
        .find_map(|name| variable(name).map(|value| (name, value)))
}

/// The client that sends spans, trusting the CA a certificate variable
/// names besides the system's roots. Built on a thread of its own: a
/// blocking reqwest client owns a runtime, which may not be made (or
/// dropped) inside the service's.
fn http_client() -> Result<reqwest::blocking::Client, TelemetryError> {
    let timeout = match first_variable([
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]) {
        Some((variable, value)) => value
            .trim()
            .parse()
            .map(std::time::Duration::from_millis)
            .map_err(|_| TelemetryError::Timeout { variable, value })?,
        None => std::time::Duration::from_secs(10),
    };
    let mut builder = reqwest::blocking::Client::builder().timeout(timeout);
    if let Some((variable, path)) = first_variable([
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ]) {
        let pem = std::fs::read(&path).map_err(|source| TelemetryError::Certificate {
            variable,
            path: path.clone(),
            source,
        })?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
            TelemetryError::CertificatePem {
                variable,
                path,
                source,
            }
        })?;
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    std::thread::spawn(move || builder.build())
        .join()
        .map_err(|_| TelemetryError::ClientPanicked)?
        .map_err(TelemetryError::Client)
}

/// Installs the global subscriber: logs filtered by `RUST_LOG` (or
/// `default_filter`), and the OpenTelemetry layer when an OTLP endpoint is
/// configured. Keep the returned guard until the process ends.
pub fn init(
    format: LogFormat,
    default_filter: &str,
    service_name: &'static str,
) -> Result<Telemetry, TelemetryError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let provider = endpoint_configured()
        .then(|| tracer_provider(service_name))
        .transpose()?;
    // Spans at info and above reach the exporter whatever RUST_LOG says:
    // the sampler decides what is kept, not the log filter.
    let otel = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(service_name))
            .with_filter(EnvFilter::new("info,sqlx=off,h2=off,hyper=off,reqwest=off"))
    });
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_filter(filter).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
    };
    // Fails only if a subscriber is already installed (tests): keep that one.
    let installed = tracing_subscriber::registry()
        .with(logs)
        .with(otel)
        .try_init()
        .is_ok();
    if installed && provider.is_some() {
        context::start_recording();
    }
    Ok(Telemetry { provider })
}

/// An error and its sources, on one line (`a: b: c`): how an error is
/// logged and shown once, whole.
pub fn cause_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
