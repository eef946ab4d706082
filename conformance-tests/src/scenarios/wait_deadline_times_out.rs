use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn wait_deadline_times_out(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
