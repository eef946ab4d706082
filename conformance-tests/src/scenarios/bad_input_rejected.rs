use std::sync::Arc;

use crate::{Harness, Outcome};

/// TODO
pub async fn bad_input_rejected(h: Arc<dyn Harness>) -> Outcome {
    let _ = h;
    Ok(())
}
