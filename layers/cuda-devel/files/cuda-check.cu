// nodeforge's CUDA check: host code plus a kernel, built against the image's cudart.
// Without a GPU (or without a driver) it reports the CUDA error and exits with its number:
// cudaErrorNoDevice (100) or cudaErrorInsufficientDriver (35) - proof that the runtime loads.
// With a GPU it launches the kernel, checks every result and exits 0.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void axpy(int n, float a, const float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

static int fail(const char *what, cudaError_t err) {
  printf("%s: %s (%d): %s\n", what, cudaGetErrorName(err), (int)err, cudaGetErrorString(err));
  return (int)err;
}

int main() {
  int runtime = 0, driver = 0, count = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  printf("cudart %d.%d, driver supports %d.%d\n", runtime / 1000, runtime % 1000 / 10, driver / 1000,
         driver % 1000 / 10);
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return fail("cudaGetDeviceCount", err);
  if (count == 0) return fail("cudaGetDeviceCount", cudaErrorNoDevice);
  cudaDeviceProp prop;
  if ((err = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) return fail("cudaGetDeviceProperties", err);
  printf("device 0: %s, compute capability %d.%d, %d device(s)\n", prop.name, prop.major, prop.minor, count);

  const int n = 1 << 20;
  float *x, *y;
  if ((err = cudaMallocManaged(&x, n * sizeof(float))) != cudaSuccess) return fail("cudaMallocManaged", err);
  if ((err = cudaMallocManaged(&y, n * sizeof(float))) != cudaSuccess) return fail("cudaMallocManaged", err);
  for (int i = 0; i < n; i++) { x[i] = 1.0f; y[i] = (float)i; }
  axpy<<<(n + 255) / 256, 256>>>(n, 2.0f, x, y);
  if ((err = cudaGetLastError()) != cudaSuccess) return fail("kernel launch", err);
  if ((err = cudaDeviceSynchronize()) != cudaSuccess) return fail("cudaDeviceSynchronize", err);
  int wrong = 0;
  for (int i = 0; i < n; i++) wrong += y[i] != 2.0f + (float)i;
  cudaFree(x);
  cudaFree(y);
  if (wrong) {
    printf("kernel FAILED: %d of %d results wrong\n", wrong, n);
    return 1;
  }
  printf("kernel ok: %d results checked\n", n);
  return 0;
}
