use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn lost_fires_when_renewal_impossible(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
