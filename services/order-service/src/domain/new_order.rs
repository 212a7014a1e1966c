use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{CustomerId, FieldError, Quantity, Sku};

/// The body of `POST /orders`, as sent: shapes are checked by serde, rules by
/// [`NewOrder::parse`].
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderRequest {
    /// The customer placing the order: 1 to 128 characters, not only
    /// white space, no control characters.
    #[schema(
        example = "c-42",
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$"
    )]
    pub customer_id: String,
    /// 1 to 100 items, each sku at most once.
    #[schema(min_items = 1, max_items = 100)]
    pub items: Vec<OrderRequestItem>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequestItem {
    #[schema(example = "ABC-1", pattern = "^[A-Z0-9-]{1,64}$")]
    pub sku: String,
    #[schema(example = 2, minimum = 1, maximum = 10000)]
    #[serde(deserialize_with = "http_api::json_integer")]
    pub quantity: i64,
}

/// An order request that passed every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    pub customer_id: CustomerId,
    pub items: Vec<NewOrderItem>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrderItem {
    pub sku: Sku,
    pub quantity: Quantity,
}

impl NewOrder {
    pub const MAX_ITEMS: usize = 100;

    /// Checks every rule and reports every broken one, so a client fixes its
    /// request in one round trip.
    pub fn parse(request: OrderRequest) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let customer_id = CustomerId::parse(request.customer_id)
            .map_err(|detail| errors.push(FieldError::new("/customerId", detail)))
            .ok();
        if request.items.is_empty() {
            errors.push(FieldError::new("/items", "must contain at least one item"));
        }
        if request.items.len() > Self::MAX_ITEMS {
            errors.push(FieldError::new(
                "/items",
                format!("must contain at most {} items", Self::MAX_ITEMS),
            ));
        }
        let mut seen = HashSet::new();
        let mut items = Vec::with_capacity(request.items.len());
        for (index, item) in request.items.into_iter().enumerate() {
            let sku = Sku::parse(&item.sku)
                .map_err(|invalid| {
                    errors.push(FieldError::new(
                        format!("/items/{index}/sku"),
                        invalid.to_string(),
                    ))
                })
                .ok();
            let quantity = Quantity::parse(item.quantity)
                .map_err(|detail| {
                    errors.push(FieldError::new(format!("/items/{index}/quantity"), detail))
                })
                .ok();
            if let Some(sku) = &sku
                && !seen.insert(sku.clone())
            {
                errors.push(FieldError::new(
                    format!("/items/{index}/sku"),
                    format!("{sku} appears more than once; send one item per sku"),
                ));
            }
            if let (Some(sku), Some(quantity)) = (sku, quantity) {
                items.push(NewOrderItem { sku, quantity });
            }
        }
        match customer_id {
            Some(customer_id) if errors.is_empty() => Ok(Self { customer_id, items }),
            _ => Err(errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(customer_id: &str, items: &[(&str, i64)]) -> OrderRequest {
        OrderRequest {
            customer_id: customer_id.to_owned(),
            items: items
                .iter()
                .map(|(sku, quantity)| OrderRequestItem {
                    sku: (*sku).to_owned(),
                    quantity: *quantity,
                })
                .collect(),
        }
    }

    fn pointers(result: Result<NewOrder, Vec<FieldError>>) -> Vec<String> {
        result
            .expect_err("the request is invalid")
            .into_iter()
            .map(|e| e.pointer)
            .collect()
    }

    #[test]
    fn a_valid_request_keeps_its_items_in_order() {
        let order = NewOrder::parse(request("c-42", &[("B-2", 1), ("A-1", 2)])).unwrap();
        let skus: Vec<&str> = order.items.iter().map(|i| i.sku.as_str()).collect();
        assert_eq!(skus, ["B-2", "A-1"]);
        assert_eq!(order.customer_id.as_str(), "c-42");
    }

    #[test]
    fn every_broken_rule_is_reported_with_its_pointer() {
        let result = NewOrder::parse(request("", &[("abc", 0), ("A-1", 10_001), ("A-1", 1)]));
        assert_eq!(
            pointers(result),
            [
                "#/customerId",
                "#/items/0/sku",
                "#/items/0/quantity",
                "#/items/1/quantity",
                "#/items/2/sku",
            ]
        );
    }

    #[test]
    fn empty_and_oversized_item_lists_are_refused() {
        assert_eq!(pointers(NewOrder::parse(request("c", &[]))), ["#/items"]);
        let many: Vec<(String, i64)> = (0..101).map(|n| (format!("S-{n}"), 1)).collect();
        let many: Vec<(&str, i64)> = many.iter().map(|(s, q)| (s.as_str(), *q)).collect();
        assert_eq!(pointers(NewOrder::parse(request("c", &many))), ["#/items"]);
    }
}
