use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn store_unavailable(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
