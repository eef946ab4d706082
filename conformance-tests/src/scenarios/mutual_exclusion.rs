use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn mutual_exclusion(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
