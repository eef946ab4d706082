use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn many_keys(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
