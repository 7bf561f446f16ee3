//! The gRPC health service's view of this replica: NOT_SERVING until a policy version is active,
//! SERVING after, for the server as a whole and for each capgate service by name (the probes in
//! deploy/kubernetes ask for the whole server).

use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::wire::proto::decision_service_server::DecisionServiceServer;
use crate::wire::proto::policy_service_server::PolicyServiceServer;

/// Sets the serving status of every name the health service answers for.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
}

impl Health {
    pub fn new(reporter: HealthReporter) -> Self {
        Health { reporter }
    }

    /// The same status for the server (`""`) and for both services.
    pub async fn set(&self, status: ServingStatus) {
        self.reporter.set_service_status("", status).await;
        self.reporter
            .set_service_status(
                <DecisionServiceServer<()> as tonic::server::NamedService>::NAME,
                status,
            )
            .await;
        self.reporter
            .set_service_status(
                <PolicyServiceServer<()> as tonic::server::NamedService>::NAME,
                status,
            )
            .await;
    }
}
