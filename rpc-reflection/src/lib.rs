//! gRPC server reflection for rdma-rpc servers: `grpc.reflection.v1` and its predecessor
//! `grpc.reflection.v1alpha` (which some clients still ask first, grpcio's among them),
//! answered from the encoded `FileDescriptorSet`s that `rpc-codegen` writes
//! (`file_descriptor_set_path`), in the shape of `tonic-reflection`:
//!
//! ```no_run
//! # fn run(descriptors: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//! let (v1, v1alpha) = rpc_reflection::builder()
//!     .register_encoded_file_descriptor_set(descriptors)?
//!     .build();
//! let server = rpc_core::Server::builder().add_service(v1).add_service(v1alpha);
//! # Ok(()) }
//! ```
//!
//! A client lists the services (those of the registered files, the reflection services
//! included), and asks for the file of a name, of a symbol (a service, method, message,
//! enum or extension) or of an extension: the answer is that file and every file it
//! depends on, so the client can build the types. Each answer is as large as the files it
//! holds; a question about something unknown is answered `NOT_FOUND` in the stream, which
//! goes on.

#![forbid(unsafe_code)]

mod index;

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use prost::Message;
use rpc_core::{Code, Request, Response, Status, Streaming};

use index::Index;

/// The generated messages, client and server of `grpc.reflection.v1`.
#[allow(missing_docs, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/grpc.reflection.v1.rs"));
}

/// The generated messages, client and server of `grpc.reflection.v1alpha`.
#[allow(missing_docs, clippy::all)]
pub mod v1alpha {
    include!(concat!(env!("OUT_DIR"), "/grpc.reflection.v1alpha.rs"));
}

/// The descriptors of the reflection services themselves.
const OWN_DESCRIPTORS: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/reflection_descriptors.bin"));

/// A descriptor set that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("not an encoded FileDescriptorSet: {0}")]
pub struct Error(#[from] prost::DecodeError);

/// Collects descriptor sets; [`Builder::build`] serves them.
#[derive(Debug)]
pub struct Builder {
    index: Index,
}

/// A builder that knows the reflection services' own files.
pub fn builder() -> Builder {
    let mut index = Index::default();
    index.add(
        prost_types::FileDescriptorSet::decode(OWN_DESCRIPTORS).expect("built by rpc-codegen"),
    );
    Builder { index }
}

impl Builder {
    /// Adds the files of an encoded `FileDescriptorSet` (what `rpc-codegen`'s
    /// `file_descriptor_set_path` writes). A file already registered keeps its first
    /// registration.
    pub fn register_encoded_file_descriptor_set(mut self, encoded: &[u8]) -> Result<Self, Error> {
        self.index
            .add(prost_types::FileDescriptorSet::decode(encoded)?);
        Ok(self)
    }

    /// Both services, over the same files.
    pub fn build(
        self,
    ) -> (
        v1::server_reflection_server::ServerReflectionServer<Reflection>,
        v1alpha::server_reflection_server::ServerReflectionServer<Reflection>,
    ) {
        let reflection = Reflection {
            index: Arc::new(self.index),
        };
        (
            v1::server_reflection_server::ServerReflectionServer::new(reflection.clone()),
            v1alpha::server_reflection_server::ServerReflectionServer::new(reflection),
        )
    }
}

/// The reflection service, either version.
#[derive(Debug, Clone)]
pub struct Reflection {
    index: Arc<Index>,
}

/// A question of either version.
enum Question {
    File(String),
    Symbol(String),
    Extension(String, i32),
    ExtensionNumbers(String),
    Services,
    None,
}

/// An answer of either version.
enum Answer {
    Files(Vec<bytes::Bytes>),
    ExtensionNumbers(String, Vec<i32>),
    Services(Vec<String>),
    Error(Code, String),
}

/// Longest part of a name an error message repeats: a client's question is as long as it
/// likes, an answer's error message is not.
const NAME_IN_ERRORS: usize = 256;

/// `name`, cut to [`NAME_IN_ERRORS`] bytes at a character boundary.
fn cut(name: &str) -> &str {
    let mut end = name.len().min(NAME_IN_ERRORS);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

impl Reflection {
    fn answer(&self, question: Question) -> Answer {
        let index = &self.index;
        let files =
            |file: Option<&str>, what: String| match file.and_then(|f| index.file_with_deps(f)) {
                Some(files) => Answer::Files(files),
                None => Answer::Error(Code::NotFound, format!("{what} is not known here")),
            };
        match question {
            Question::File(name) => files(Some(&name), format!("file {:?}", cut(&name))),
            Question::Symbol(symbol) => files(
                index.file_of_symbol(&symbol),
                format!("symbol {:?}", cut(&symbol)),
            ),
            Question::Extension(message, number) => files(
                index.file_of_extension(&message, number),
                format!("extension {number} of {:?}", cut(&message)),
            ),
            Question::ExtensionNumbers(message) => match index.extension_numbers(&message) {
                Some(numbers) => Answer::ExtensionNumbers(message, numbers),
                None => Answer::Error(
                    Code::NotFound,
                    format!("type {:?} is not known here", cut(&message)),
                ),
            },
            Question::Services => Answer::Services(index.services().map(str::to_owned).collect()),
            Question::None => {
                Answer::Error(Code::InvalidArgument, "the request asks nothing".into())
            }
        }
    }
}

/// The service of one version's generated module: the same questions and answers in its
/// types.
macro_rules! serve_version {
    ($version:ident) => {
        impl $version::server_reflection_server::ServerReflection for Reflection {
            type ServerReflectionInfoStream = Pin<
                Box<dyn Stream<Item = Result<$version::ServerReflectionResponse, Status>> + Send>,
            >;

            async fn server_reflection_info(
                &self,
                request: Request<Streaming<$version::ServerReflectionRequest>>,
            ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
                use $version::server_reflection_request::MessageRequest as Ask;
                use $version::server_reflection_response::MessageResponse as Tell;
                let this = self.clone();
                let answers = request.into_inner().map(move |asked| {
                    let asked = asked?;
                    let question = match asked.message_request.clone() {
                        Some(Ask::FileByFilename(name)) => Question::File(name),
                        Some(Ask::FileContainingSymbol(symbol)) => Question::Symbol(symbol),
                        Some(Ask::FileContainingExtension(ext)) => {
                            Question::Extension(ext.containing_type, ext.extension_number)
                        }
                        Some(Ask::AllExtensionNumbersOfType(message)) => {
                            Question::ExtensionNumbers(message)
                        }
                        Some(Ask::ListServices(_)) => Question::Services,
                        None => Question::None,
                    };
                    let told = match this.answer(question) {
                        Answer::Files(files) => {
                            Tell::FileDescriptorResponse($version::FileDescriptorResponse {
                                file_descriptor_proto: files.into_iter().map(Vec::from).collect(),
                            })
                        }
                        Answer::ExtensionNumbers(base_type_name, extension_number) => {
                            Tell::AllExtensionNumbersResponse($version::ExtensionNumberResponse {
                                base_type_name,
                                extension_number,
                            })
                        }
                        Answer::Services(names) => {
                            Tell::ListServicesResponse($version::ListServiceResponse {
                                service: names
                                    .into_iter()
                                    .map(|name| $version::ServiceResponse { name })
                                    .collect(),
                            })
                        }
                        Answer::Error(code, error_message) => {
                            Tell::ErrorResponse($version::ErrorResponse {
                                error_code: code as i32,
                                error_message,
                            })
                        }
                    };
                    Ok($version::ServerReflectionResponse {
                        valid_host: asked.host.clone(),
                        original_request: Some(asked),
                        message_response: Some(told),
                    })
                });
                Ok(Response::new(Box::pin(answers)))
            }
        }
    };
}

serve_version!(v1);
serve_version!(v1alpha);
