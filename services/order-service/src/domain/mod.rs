//! The order domain: values that can only exist when valid. Each type is
//! built through `parse`, so the rest of the service never re-checks input.

mod customer_id; // who placed the order
mod new_order; // a validated POST /orders request
mod order_id; // UUIDv7 order identifiers
mod quantity; // how many of one sku

pub use customer_id::CustomerId;
pub use http_api::FieldError;
pub use new_order::{NewOrder, NewOrderItem, OrderRequest, OrderRequestItem};
pub use order_id::OrderId;
pub use quantity::Quantity;
pub use service_support::sku::Sku;
